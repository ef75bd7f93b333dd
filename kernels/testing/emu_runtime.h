// The CPU emulator's runtime: Metal's execution model for kernels compiled as C++ with msl.h
// (KF_MSL_EMULATE). Included once, after msl.h and before the kernels, by the unit metal_emu.py
// writes; that unit ends with the table of kernels (kf_emu::KERNELS) and calls kf_emu::main.
//
// - One threadgroup at a time; each of its threads is a fiber (its own stack, guard page below).
// - threadgroup_barrier and every simd_* call are rendezvous points: a fiber runs until it reaches
//   one, then the next runs. A SIMD-group is 32 consecutive threads (thread_index_in_threadgroup);
//   its call completes when all its live lanes are there, at the same call site. A barrier
//   completes when every live thread of the group is there, at the same call site. Reached by only
//   some threads (others returned, or wait elsewhere): an error naming the line and the threads.
// - Run-ahead schedule (job line `schedule run-ahead`): before the others move, one SIMD-group (the
//   leader: the last for threadgroup 0, the one below for the next ...) runs as far as it can, its
//   own SIMD-group calls resolved at once, until it waits at a barrier or returns. So a write placed
//   after a SIMD call lands before a slower SIMD-group's read placed before one: a write-after-read
//   race on threadgroup memory (a reduction buffer reused without a barrier) shows.
// - Threadgroup memory (kf_threadgroup_memory) is shared by the group, and filled with 0xFF bytes
//   (NaN in every float type) before each group; so are outputs before the launch. Each threadgroup
//   variable ends 16-aligned just before a PROT_NONE page; the slack of its pages below it (and the
//   alignment bytes above it) is filled with 0xFF too, so that a read just below the array (buf[-1])
//   reads NaN, not zero, and is checked after each group: a write there is an error.
// - Every buffer ends at a PROT_NONE page and starts after one: an access outside faults and is
//   reported with the buffer it was nearest to.
// - Thread order within a group and group order are shuffled when a seed is given.
#pragma once

// The C library is visible to the emulated kernels' unit; the strict model is what keeps C names
// (erff, fmaxf ...) out of kernels.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

namespace kf_emu {

using metal::uint3;
constexpr int SIMD = 32;
constexpr unsigned long PAGE = 4096;
constexpr unsigned long STACK = 256 * 1024;

struct Attrs {
  uint3 thread_position_in_threadgroup, threadgroup_position_in_grid, thread_position_in_grid,
      threads_per_threadgroup, dispatch_threads_per_threadgroup, threadgroups_per_grid, threads_per_grid,
      grid_size, grid_origin;
  uint thread_index_in_threadgroup, simdgroup_index_in_threadgroup, thread_index_in_simdgroup,
      threads_per_simdgroup, thread_execution_width, simdgroups_per_threadgroup,
      dispatch_simdgroups_per_threadgroup, quadgroup_index_in_threadgroup, thread_index_in_quadgroup,
      quadgroups_per_threadgroup, dispatch_quadgroups_per_threadgroup;
};

typedef void (*Entry)(void** buffers, const Attrs& a);
struct Kernel {
  const char* name;
  Entry entry;
};

// ---------------------------------------------------------------- errors
static char g_where[256];
[[noreturn]] static void fail(const char* what) {
  printf("error: %s (%s)\n", what, g_where);
  exit(3);
}
static int fmt(char* out, int n, const char* f, long a = 0, long b = 0, long c = 0, long d = 0) {
  // a tiny snprintf for %ld only (no C library headers in the unit)
  int o = 0;
  long args[4] = {a, b, c, d};
  int k = 0;
  for (const char* p = f; *p && o < n - 24; ++p) {
    if (p[0] == '%' && p[1] == 'l' && p[2] == 'd') {
      long v = args[k++];
      char tmp[24];
      int t = 0;
      bool neg = v < 0;
      unsigned long u = neg ? -(unsigned long)v : (unsigned long)v;
      do { tmp[t++] = char('0' + u % 10); u /= 10; } while (u);
      if (neg) out[o++] = '-';
      while (t) out[o++] = tmp[--t];
      p += 2;
    } else {
      out[o++] = *p;
    }
  }
  out[o] = 0;
  return o;
}

// ---------------------------------------------------------------- guarded memory
struct Region {
  char* base;  // first byte usable
  unsigned long size;
  const char* name;
};
static Region g_regions[256];
static int g_nregions = 0;

// `size` bytes ending 16-aligned just before a PROT_NONE page, with another PROT_NONE page below.
static char* guarded(unsigned long size, const char* name) {
  unsigned long body = (size + 15) / 16 * 16;
  unsigned long span = (body + PAGE - 1) / PAGE * PAGE;
  char* m = (char*)mmap(nullptr, span + 2 * PAGE, 3 /*RW*/, 0x22 /*PRIVATE|ANON*/, -1, 0);
  if (m == (char*)-1) fail("mmap failed");
  mprotect(m, PAGE, 0);
  mprotect(m + PAGE + span, PAGE, 0);
  char* p = m + PAGE + span - body;
  if (g_nregions < 256) g_regions[g_nregions++] = Region{p, size, name};
  return p;
}

static void on_fault(int, siginfo_t* info, void*) {
  char msg[512];
  char* addr = (char*)info->si_addr;
  const Region* best = nullptr;
  long dist = 0;
  for (int i = 0; i < g_nregions; ++i) {
    const Region& r = g_regions[i];
    long d = addr < r.base ? r.base - addr : addr - (r.base + r.size) + 1;
    if (!best || d < dist) best = &r, dist = d;
  }
  int n = fmt(msg, 256, "error: memory fault: an access outside every buffer, ");
  if (best) {
    long off = addr - best->base;
    n += fmt(msg + n, 200, "at byte offset %ld of a %ld-byte buffer ", off, (long)best->size);
    for (const char* s = best->name; *s && n < 400; ++s) msg[n++] = *s;
  }
  msg[n++] = ' ';
  msg[n++] = '(';
  for (const char* s = g_where; *s && n < 500; ++s) msg[n++] = *s;
  msg[n++] = ')';
  msg[n++] = '\n';
  write(1, msg, n);
  _exit(4);
}

// ---------------------------------------------------------------- fibers
extern "C" void kf_switch(void** save_sp, void* load_sp);
#if defined(__x86_64__)
asm(R"(
.text
.globl kf_switch
kf_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
)");
#elif defined(__aarch64__)
asm(R"(
.text
.globl kf_switch
kf_switch:
  sub sp, sp, #176
  stp x19, x20, [sp, #0]
  stp x21, x22, [sp, #16]
  stp x23, x24, [sp, #32]
  stp x25, x26, [sp, #48]
  stp x27, x28, [sp, #64]
  stp x29, x30, [sp, #80]
  stp d8, d9, [sp, #96]
  stp d10, d11, [sp, #112]
  stp d12, d13, [sp, #128]
  stp d14, d15, [sp, #144]
  mov x9, sp
  str x9, [x0]
  mov sp, x1
  ldp x19, x20, [sp, #0]
  ldp x21, x22, [sp, #16]
  ldp x23, x24, [sp, #32]
  ldp x25, x26, [sp, #48]
  ldp x27, x28, [sp, #64]
  ldp x29, x30, [sp, #80]
  ldp d8, d9, [sp, #96]
  ldp d10, d11, [sp, #112]
  ldp d12, d13, [sp, #128]
  ldp d14, d15, [sp, #144]
  add sp, sp, #176
  ret
)");
#else
#error "the Metal emulator's fibers need x86-64 or arm64"
#endif

enum State { RUNNABLE, AT_BARRIER, AT_SIMD, DONE };
struct Fiber;
typedef void (*Resolver)(Fiber** lanes, int n);
struct Fiber {
  void* sp;
  char* stack;
  State state;
  int line, op;
  uint arg;
  alignas(16) unsigned char value[32];
  alignas(16) unsigned char result[32];
  Resolver resolve;
  int allocs;  // threadgroup variables declared so far
  Attrs attrs;
};

static Fiber* g_fibers = nullptr;
static int g_nfibers = 0, g_capacity = 0;
static int g_current = -1;
static void* g_sched_sp = nullptr;
static Entry g_entry = nullptr;
static void** g_buffers = nullptr;

static void trampoline() {
  Fiber& f = g_fibers[g_current];
  g_entry(g_buffers, f.attrs);
  f.state = DONE;
  kf_switch(&f.sp, g_sched_sp);
  __builtin_trap();
}

static void start_fiber(Fiber& f) {
  if (!f.stack) {
    char* m = (char*)mmap(nullptr, STACK + PAGE, 3, 0x22, -1, 0);
    if (m == (char*)-1) fail("mmap failed (fiber stack)");
    mprotect(m, PAGE, 0);
    f.stack = m + PAGE;
  }
  unsigned long top = ((unsigned long)(f.stack + STACK)) & ~15ul;
#if defined(__x86_64__)
  void** sp = (void**)top;
  *--sp = nullptr;                 // the trampoline's (unused) return address
  *--sp = (void*)&trampoline;      // kf_switch's `ret` lands here
  for (int i = 0; i < 6; ++i) *--sp = nullptr;  // rbp rbx r12-r15
  f.sp = sp;
#else
  void** sp = (void**)(top - 176);
  memset(sp, 0, 176);
  sp[11] = (void*)&trampoline;     // x30 (lr)
  f.sp = sp;
#endif
  f.state = RUNNABLE;
  f.allocs = 0;
}

static void yield_to_scheduler() {
  Fiber& f = g_fibers[g_current];
  kf_switch(&f.sp, g_sched_sp);
}

// ---------------------------------------------------------------- threadgroup memory
struct Slot {
  char* p;
  unsigned long size;
  char* lo;  // the slot's first page: [lo, p) is slack below the variable
  char* hi;  // the guard page above: [p + size, hi) is alignment slack above it
};
static Slot g_slots[64];
static int g_nslots = 0;

// The variable and the slack around it, all 0xFF (NaN) bytes.
static void fill_slot(const Slot& s) { memset(s.lo, 0xff, (unsigned long)(s.hi - s.lo)); }

// After a group: the slack around every variable still 0xFF, or an error naming where it was written.
static void check_slack() {
  for (int k = 0; k < g_nslots; ++k) {
    const Slot& s = g_slots[k];
    for (const char* q = s.lo; q < s.hi; ++q) {
      if (q == s.p) q += s.size;
      if (q < s.hi && (unsigned char)*q != 0xff) {
        char msg[200];
        long off = q - s.p;
        fmt(msg, 200, "a write outside threadgroup variable #%ld (%ld bytes): at byte offset %ld",
            k, (long)s.size, off);
        fail(msg);
      }
    }
  }
}

static void* threadgroup_slot(unsigned long size) {
  Fiber& f = g_fibers[g_current];
  int k = f.allocs++;
  if (k == g_nslots) {
    if (k == 64) fail("more than 64 threadgroup variables");
    char* p = guarded(size, "(threadgroup memory)");
    g_slots[k] = Slot{p, size, (char*)((unsigned long)p & ~(PAGE - 1)), p + (size + 15) / 16 * 16};
    fill_slot(g_slots[k]);
    ++g_nslots;
  }
  if (g_slots[k].size != size) fail("threads of one group declared different threadgroup variables");
  return g_slots[k].p;
}

// ---------------------------------------------------------------- rendezvous
void barrier(int line) {
  Fiber& f = g_fibers[g_current];
  f.state = AT_BARRIER;
  f.line = line;
  yield_to_scheduler();
}

template <typename T> static T load(const unsigned char* p) {
  T v;
  memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T> static void store(unsigned char* p, T v) { memcpy(p, &v, sizeof(T)); }

template <typename T> constexpr bool integral = metal::is_same_v<T, int> || metal::is_same_v<T, uint> ||
    metal::is_same_v<T, short> || metal::is_same_v<T, ushort> || metal::is_same_v<T, char> ||
    metal::is_same_v<T, signed char> || metal::is_same_v<T, uchar> || metal::is_same_v<T, bool>;

enum { OP_BARRIER, OP_SUM, OP_PRODUCT, OP_MAX, OP_MIN, OP_AND, OP_OR, OP_XOR, OP_PREFIX_INCL, OP_PREFIX_EXCL,
       OP_SHUFFLE, OP_SHUFFLE_XOR, OP_SHUFFLE_UP, OP_SHUFFLE_DOWN, OP_BROADCAST, OP_ALL, OP_ANY };

template <typename T> static void resolve(Fiber** lanes, int n) {
  T v[SIMD];
  for (int i = 0; i < n; ++i) v[i] = load<T>(lanes[i]->value);
  const int op = lanes[0]->op;
  for (int i = 0; i < n; ++i) {
    T r = v[i];
    const uint a = lanes[i]->arg;
    int src = -1;
    switch (op) {
      case OP_BARRIER: break;
      case OP_SUM: case OP_PREFIX_INCL: case OP_PREFIX_EXCL: {
        int end = op == OP_SUM ? n : (op == OP_PREFIX_INCL ? i + 1 : i);
        T acc = T(0);
        for (int j = 0; j < end; ++j) acc = T(acc + v[j]);
        r = acc;
        break;
      }
      case OP_PRODUCT: { T acc = T(1); for (int j = 0; j < n; ++j) acc = T(acc * v[j]); r = acc; break; }
      case OP_MAX: for (int j = 0; j < n; ++j) r = metal::kf_max(r, v[j]); break;
      case OP_MIN: for (int j = 0; j < n; ++j) r = metal::kf_min(r, v[j]); break;
      case OP_AND: case OP_OR: case OP_XOR:
        if constexpr (integral<T>) {
          for (int j = 0; j < n; ++j) {
            if (j == i) continue;
            r = op == OP_AND ? T(r & v[j]) : op == OP_OR ? T(r | v[j]) : T(r ^ v[j]);
          }
        } else {
          fail("simd_and/or/xor on a floating-point type");
        }
        break;
      case OP_SHUFFLE: case OP_BROADCAST: src = int(a); break;
      case OP_SHUFFLE_XOR: src = i ^ int(a); break;
      case OP_SHUFFLE_UP: src = i - int(a) < 0 ? i : i - int(a); break;
      case OP_SHUFFLE_DOWN: src = i + int(a) >= n ? i : i + int(a); break;
      case OP_ALL: case OP_ANY: {
        bool acc = op == OP_ALL;
        for (int j = 0; j < n; ++j) acc = op == OP_ALL ? (acc && bool(v[j])) : (acc || bool(v[j]));
        r = T(acc);
        break;
      }
    }
    if (src >= 0) {
      if (src >= n) {
        char msg[160];
        fmt(msg, 160, "simd shuffle at line %ld: lane %ld reads lane %ld, which does not exist (%ld lanes)",
            lanes[i]->line, i, src, n);
        fail(msg);
      }
      r = v[src];
    }
    store<T>(lanes[i]->result, r);
  }
}

template <typename T> T simd_op(int op, T value, uint arg, int line) {
  static_assert(sizeof(T) <= 32, "SIMD value too large");
  Fiber& f = g_fibers[g_current];
  store<T>(f.value, value);
  f.op = op;
  f.arg = arg;
  f.line = line;
  f.resolve = &resolve<T>;
  f.state = AT_SIMD;
  yield_to_scheduler();
  return load<T>(g_fibers[g_current].result);
}

// ---------------------------------------------------------------- scheduling
static unsigned long g_rng = 0;
static unsigned long next_random() {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return g_rng;
}

static bool g_run_ahead = false;

// Resolve SIMD-group s's pending call if all its live lanes wait at it (an error if they wait at
// different calls, or some lanes returned). Whether it did.
static bool resolve_simd_group(int s, int n) {
  Fiber* lanes[SIMD];
  int m = 0, live = 0, waiting = 0;
  int lo = s * SIMD, hi = lo + SIMD < n ? lo + SIMD : n;
  for (int i = lo; i < hi; ++i) {
    live += g_fibers[i].state != DONE;
    waiting += g_fibers[i].state == AT_SIMD;
    lanes[m++] = &g_fibers[i];
  }
  if (waiting == 0 || waiting != live) return false;
  char msg[300];
  if (live != m) {
    int line = 0;
    for (int i = 0; i < m; ++i) line = lanes[i]->state == AT_SIMD ? lanes[i]->line : line;
    fmt(msg, 300, "a SIMD-group function at line %ld reached by %ld of the %ld lanes of SIMD-group %ld "
        "(the others returned)", line, live, m, s);
    fail(msg);
  }
  for (int i = 1; i < m; ++i)
    if (lanes[i]->line != lanes[0]->line || lanes[i]->op != lanes[0]->op) {
      fmt(msg, 300, "lanes of one SIMD-group wait at different SIMD-group calls (lines %ld and %ld)",
          lanes[0]->line, lanes[i]->line);
      fail(msg);
    }
  lanes[0]->resolve(lanes, m);
  for (int i = 0; i < m; ++i) lanes[i]->state = RUNNABLE;
  return true;
}

// The run-ahead schedule's step: SIMD-group s runs, its calls resolved as they come, until its lanes
// wait at a barrier or return.
static void run_ahead(int s, int n) {
  int lo = s * SIMD, hi = lo + SIMD < n ? lo + SIMD : n;
  do {
    for (int i = lo; i < hi; ++i) {
      if (g_fibers[i].state != RUNNABLE) continue;
      g_current = i;
      kf_switch(&g_sched_sp, g_fibers[i].sp);
    }
    g_current = -1;
  } while (resolve_simd_group(s, n));
}

static void run_group(int n, const Attrs& proto, uint3 local_dims, long group) {
  if (n > g_capacity) {
    Fiber* fs = new Fiber[n];
    for (int i = 0; i < n; ++i) fs[i] = Fiber{}, fs[i].stack = i < g_capacity ? g_fibers[i].stack : nullptr;
    delete[] g_fibers;
    g_fibers = fs;
    g_capacity = n;
  }
  g_nfibers = n;
  for (int s = 0; s < g_nslots; ++s) fill_slot(g_slots[s]);
  const int nsimd = (n + SIMD - 1) / SIMD;
  const int leader = g_run_ahead && nsimd > 1 ? nsimd - 1 - int(group % nsimd) : -1;
  for (int i = 0; i < n; ++i) {
    Fiber& f = g_fibers[i];
    start_fiber(f);
    Attrs a = proto;
    uint lx = uint(i) % local_dims.x, ly = (uint(i) / local_dims.x) % local_dims.y,
         lz = uint(i) / (local_dims.x * local_dims.y);
    a.thread_position_in_threadgroup = uint3{lx, ly, lz};
    a.thread_position_in_grid = a.threadgroup_position_in_grid * a.dispatch_threads_per_threadgroup +
                                a.thread_position_in_threadgroup;
    a.thread_index_in_threadgroup = uint(i);
    a.simdgroup_index_in_threadgroup = uint(i) / SIMD;
    a.thread_index_in_simdgroup = uint(i) % SIMD;
    a.quadgroup_index_in_threadgroup = uint(i) / 4;
    a.thread_index_in_quadgroup = uint(i) % 4;
    f.attrs = a;
  }
  int order[1024];
  for (int i = 0; i < n; ++i) order[i] = i;
  for (;;) {
    if (leader >= 0) run_ahead(leader, n);
    if (g_rng)
      for (int i = n - 1; i > 0; --i) {
        int j = int(next_random() % unsigned(i + 1));
        int t = order[i]; order[i] = order[j]; order[j] = t;
      }
    for (int k = 0; k < n; ++k) {
      int i = order[k];
      if (g_fibers[i].state != RUNNABLE) continue;
      g_current = i;
      kf_switch(&g_sched_sp, g_fibers[i].sp);
    }
    g_current = -1;
    int done = 0, at_barrier = 0, at_simd = 0;
    for (int i = 0; i < n; ++i) {
      done += g_fibers[i].state == DONE;
      at_barrier += g_fibers[i].state == AT_BARRIER;
      at_simd += g_fibers[i].state == AT_SIMD;
    }
    if (done == n) {
      check_slack();
      return;
    }
    bool progressed = false;
    for (int s = 0; s * SIMD < n; ++s)  // SIMD-groups whose live lanes all wait at a SIMD call
      progressed = resolve_simd_group(s, n) || progressed;
    if (progressed) continue;
    char msg[300];
    if (at_barrier && at_barrier + done == n) {
      int line = -1;
      for (int i = 0; i < n; ++i) {
        if (g_fibers[i].state != AT_BARRIER) continue;
        if (line >= 0 && g_fibers[i].line != line) {
          fmt(msg, 300, "threads of one group wait at different threadgroup_barrier calls (lines %ld and %ld)",
              line, g_fibers[i].line);
          fail(msg);
        }
        line = g_fibers[i].line;
      }
      if (done) {
        fmt(msg, 300, "threadgroup_barrier at line %ld reached by %ld of the %ld threads of the group "
            "(the others returned)", line, at_barrier, n);
        fail(msg);
      }
      for (int i = 0; i < n; ++i) g_fibers[i].state = RUNNABLE;
      continue;
    }
    int bl = -1, sl = -1;
    for (int i = 0; i < n; ++i) {
      if (g_fibers[i].state == AT_BARRIER) bl = g_fibers[i].line;
      if (g_fibers[i].state == AT_SIMD) sl = g_fibers[i].line;
    }
    fmt(msg, 300, "deadlock: %ld threads wait at threadgroup_barrier (line %ld) while %ld wait at a "
        "SIMD-group function (line %ld) that lanes of their SIMD-group never reach",
        at_barrier, bl, at_simd, sl);
    fail(msg);
  }
}

static uint ceil_div(uint a, uint b) { return (a + b - 1) / b; }

// job file: kernel NAME / grid X Y Z / threadgroup X Y Z / seed S / group_stride K / schedule in-order|run-ahead /
// buffer in|out BYTES PATH NAME (in binding order)
int main(int argc, char** argv, const Kernel* kernels, int nkernels) {
  if (argc != 2) { printf("usage: %s JOB\n", argv[0]); return 2; }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  static char altstack[64 * 1024];
  stack_t ss;
  ss.ss_sp = altstack;
  ss.ss_size = sizeof altstack;
  ss.ss_flags = 0;
  sigaltstack(&ss, nullptr);
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);

  FILE* job = fopen(argv[1], "rb");
  if (!job) { printf("error: cannot open job %s\n", argv[1]); return 2; }
  static char text[1 << 16];
  unsigned long len = fread(text, 1, sizeof text - 1, job);
  fclose(job);
  text[len] = 0;
  char* words[512];
  int nw = 0;
  for (char* p = text; *p && nw < 512;) {
    while (*p == ' ' || *p == '\n') *p++ = 0;
    if (!*p) break;
    words[nw++] = p;
    while (*p && *p != ' ' && *p != '\n') ++p;
  }
  const char* name = nullptr;
  uint g[3] = {1, 1, 1}, t[3] = {1, 1, 1};
  long stride = 1;
  void* bufs[128];
  const char* paths[128];
  unsigned long sizes[128];
  bool is_out[128];
  int nb = 0;
  for (int i = 0; i < nw; ++i) {
    if (!strcmp(words[i], "kernel")) name = words[++i];
    else if (!strcmp(words[i], "grid")) for (int k = 0; k < 3; ++k) g[k] = uint(atoi(words[++i]));
    else if (!strcmp(words[i], "threadgroup")) for (int k = 0; k < 3; ++k) t[k] = uint(atoi(words[++i]));
    else if (!strcmp(words[i], "seed")) g_rng = (unsigned long)strtol(words[++i], nullptr, 10);
    else if (!strcmp(words[i], "group_stride")) stride = strtol(words[++i], nullptr, 10);
    else if (!strcmp(words[i], "schedule")) g_run_ahead = !strcmp(words[++i], "run-ahead");
    else if (!strcmp(words[i], "buffer")) {
      is_out[nb] = !strcmp(words[++i], "out");
      sizes[nb] = (unsigned long)strtol(words[++i], nullptr, 10);
      paths[nb] = words[++i];
      char* p = guarded(sizes[nb] ? sizes[nb] : 1, words[++i]);  // named after its kernel parameter
      if (is_out[nb]) {
        memset(p, 0xff, sizes[nb]);
      } else {
        FILE* f = fopen(paths[nb], "rb");
        if (!f || fread(p, 1, sizes[nb], f) != sizes[nb]) { printf("error: cannot read %s\n", paths[nb]); return 2; }
        fclose(f);
      }
      bufs[nb++] = p;
    }
  }
  for (int k = 0; k < nkernels; ++k)
    if (name && !strcmp(kernels[k].name, name)) g_entry = kernels[k].entry;
  if (!g_entry) { printf("error: kernel %s is not in this unit\n", name ? name : "?"); return 2; }
  g_buffers = bufs;
  if (g_rng) g_rng = g_rng * 2654435761ul + 1;
  // MLX: threadgroup dims are clipped to the grid; dispatch_threads makes partial edge groups
  for (int k = 0; k < 3; ++k) t[k] = t[k] < g[k] ? t[k] : g[k];
  if (t[0] * t[1] * t[2] > 1024) fail("threadgroup larger than 1024 threads");
  uint groups[3] = {ceil_div(g[0], t[0]), ceil_div(g[1], t[1]), ceil_div(g[2], t[2])};
  long total = long(groups[0]) * groups[1] * groups[2];
  long* order = new long[total];
  for (long i = 0; i < total; ++i) order[i] = i;
  if (g_rng)
    for (long i = total - 1; i > 0; --i) {
      long j = long(next_random() % (unsigned long)(i + 1));
      long tmp = order[i]; order[i] = order[j]; order[j] = tmp;
    }
  long ran = 0;
  for (long q = 0; q < total; ++q) {
    long gi = order[q];
    if (stride > 1 && gi % stride != 0 && gi != total - 1) continue;  // sampled groups (+ the last)
    uint b[3] = {uint(gi % groups[0]), uint(gi / groups[0] % groups[1]), uint(gi / (long(groups[0]) * groups[1]))};
    uint a[3];
    for (int k = 0; k < 3; ++k) a[k] = (b[k] + 1) * t[k] <= g[k] ? t[k] : g[k] - b[k] * t[k];
    Attrs proto{};
    proto.threadgroup_position_in_grid = uint3{b[0], b[1], b[2]};
    proto.threads_per_threadgroup = uint3{a[0], a[1], a[2]};
    proto.dispatch_threads_per_threadgroup = uint3{t[0], t[1], t[2]};
    proto.threadgroups_per_grid = uint3{groups[0], groups[1], groups[2]};
    proto.threads_per_grid = proto.grid_size = uint3{g[0], g[1], g[2]};
    proto.grid_origin = uint3{0, 0, 0};
    proto.threads_per_simdgroup = proto.thread_execution_width = SIMD;
    int n = int(a[0] * a[1] * a[2]);
    proto.simdgroups_per_threadgroup = ceil_div(uint(n), SIMD);
    proto.dispatch_simdgroups_per_threadgroup = ceil_div(t[0] * t[1] * t[2], SIMD);
    proto.quadgroups_per_threadgroup = ceil_div(uint(n), 4);
    proto.dispatch_quadgroups_per_threadgroup = ceil_div(t[0] * t[1] * t[2], 4);
    fmt(g_where, 256, "threadgroup (%ld, %ld, %ld) of kernel ", b[0], b[1], b[2]);
    int o = 0;
    while (g_where[o]) ++o;
    for (const char* s = name; *s && o < 255; ++s) g_where[o++] = *s;
    g_where[o] = 0;
    run_group(n, proto, uint3{a[0], a[1], a[2]}, gi);
    ++ran;
  }
  for (int k = 0; k < nb; ++k) {
    if (!is_out[k]) continue;
    FILE* f = fopen(paths[k], "wb");
    if (!f || fwrite(bufs[k], 1, sizes[k], f) != sizes[k]) { printf("error: cannot write %s\n", paths[k]); return 2; }
    fclose(f);
  }
  printf("ok %ld groups\n", ran);
  return 0;
}

}  // namespace kf_emu

template <typename T> T& kf_threadgroup_memory() {
  return *reinterpret_cast<T*>(kf_emu::threadgroup_slot(sizeof(T)));
}
