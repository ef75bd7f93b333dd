"""The CUDA kernel of quantized matmul on the tensor cores (``mma.sync``), for M = 1-32 tokens: the ``mma``
path of :mod:`.quantized_matmul_kernel` (``SOURCE``) and, gathered, of :mod:`.gather_quantized_matmul_kernel`
(mixture-of-experts pairs sorted by expert, any number, in tiles of 16 or 32: ``GATHER_SOURCE``); its configs
and launches are :mod:`.quantized_mma`'s.

The weights are the mma's A operand (16 output features x 16 k), the tokens its B operand (16 k x 8
tokens): ``out.T = W @ x.T``, so one A fragment serves up to 32 tokens (``NT`` n-tiles of 8), and a
decode batch of 8 costs what one token does. Each lane dequantizes its own A values in registers,
straight from MLX's packed words, with its row's scale and bias (as ``mlx.core.dequantize`` computes
them, rounded once to the activation dtype); nothing is staged in shared memory.

Lane ``(g, t) = (lane / 4, lane % 4)`` holds rows ``g`` and ``g + 8`` of a 16-row tile and loads, per
chunk of 16 words of a row (128 k at 4 bits, 64 at 8), the 4 words ``4t .. 4t+3``: one 16-byte load,
the quad of lanes reading 64 contiguous bytes. The mma reduces over 16 k positions whose order is
free as long as A and B use the same one, so each word's values go in as the pairs
``(v_j, v_{j+per/2})`` (4 bits: one shift, one and-or and one subtraction give two exact codes in a
16-bit pair, then one paired FMA dequantizes them), and ``x`` is repacked into the same pairs with
``__byte_perm``. 8-bit codes do not fit bfloat16's mantissa, so they go through float.

At 4 bits the ``gsum`` axis takes the dequantization out of the A operand: a lane loads its words so
that each mma k-step holds one group's (runs of ``group / 32`` words), the A operand is the and-or's
``offset + code`` pair itself (128 in bfloat16, 1024 in float16: exact), a group's mmas sum into their own
accumulator, a mma with ones for A sums the group's x, and then ``acc += scale * sum + (bias - offset *
scale) * sum(x)`` in float: an and-or (and at most a shift) a code pair where the other path adds a
subtraction and a paired FMA, no weight rounded to 16 bits, and 8 float FMAs per group, row tile and 8
tokens. Measured on an H200 it wins where a warp holds many chunks of K (14336x4096 at M=8: 1.10x) and
not at K = 4096 (``benchmarks/results/h200_mma_gsum.txt``); the tuner picks.

Axes (the config keys qmv uses too): ``rpw`` rows per warp, 16, 32 or 64 (``RT`` tiles of 16; x is read
once per warp for all of them), ``tg`` threads in a block whose warps split K (a shared-memory sum at
the end), ``unr`` chunks loaded before use (loads in flight), ``gsum`` (4 bits) as above; ``vw`` is 4
(16-byte loads: with ``gsum``, ``group / 32`` words a load). float16
and bfloat16 only: float32 activations would be rounded to 16 bits. Metal has no such path
(``simdgroup_matrix`` would need the emulator to model it): the spec offers these configs to CUDA
workers only.
"""

from __future__ import annotations

from ..render.launch import KernelSource

# The paired 16-bit arithmetic and the mma, per activation type (CUDA only; sm_80 and newer).
HEADER = r"""
// A pair of 16-bit values as the 32-bit register the mma takes, and back (a bit copy).
template <typename P> __device__ __forceinline__ unsigned int kf_bits(P v) {
  unsigned int r; memcpy(&r, &v, 4); return r;
}
template <typename P> __device__ __forceinline__ P kf_pair(unsigned int v) {
  P r; memcpy(&r, &v, 4); return r;
}

template <typename T> struct kf_mma;

template <> struct kf_mma<__nv_bfloat16> {
  using P = __nv_bfloat162;
  // 0x4300 is bfloat16 128.0: a 4-bit code OR'd into its mantissa gives 128 + code exactly; 0x3F80 is 1.0
  static constexpr unsigned int MAGIC = 0x43004300u;
  static constexpr float OFFSET = 128.0f;
  static constexpr unsigned int ONE = 0x3F803F80u;
  static __device__ __forceinline__ unsigned int splat(float v) { return kf_bits(__float2bfloat162_rn(v)); }
  static __device__ __forceinline__ unsigned int pack(float lo, float hi) {
    return kf_bits(__floats2bfloat162_rn(lo, hi));
  }
  static __device__ __forceinline__ void mma(float* c, unsigned int a0, unsigned int a1, unsigned int a2,
                                             unsigned int a3, unsigned int b0, unsigned int b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
};

template <> struct kf_mma<__half> {
  using P = __half2;
  // 0x6400 is float16 1024.0: a 4-bit code OR'd into its mantissa gives 1024 + code exactly; 0x3C00 is 1.0
  static constexpr unsigned int MAGIC = 0x64006400u;
  static constexpr float OFFSET = 1024.0f;
  static constexpr unsigned int ONE = 0x3C003C00u;
  static __device__ __forceinline__ unsigned int splat(float v) { return kf_bits(__float2half2_rn(v)); }
  static __device__ __forceinline__ unsigned int pack(float lo, float hi) {
    return kf_bits(__floats2half2_rn(lo, hi));
  }
  static __device__ __forceinline__ void mma(float* c, unsigned int a0, unsigned int a1, unsigned int a2,
                                             unsigned int a3, unsigned int b0, unsigned int b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
};

// Two 4-bit codes OR'd into kf_mma<T>::MAGIC's mantissas -> scale * (c0, c1) + bias, each rounded once
template <typename T> __device__ __forceinline__ unsigned int kf_dequant2(unsigned int magic_codes,
                                                                          unsigned int s, unsigned int b) {
  using P = typename kf_mma<T>::P;
  return kf_bits(__hfma2(__hsub2(kf_pair<P>(magic_codes), kf_pair<P>(kf_mma<T>::MAGIC)), kf_pair<P>(s),
                         kf_pair<P>(b)));
}
"""

# The kernel is written once; a plain call and a gathered (mixture-of-experts) call differ only in where
# a block's rows, tokens and expert come from. CORE computes one 16 * RT-row block of one expert's weights
# (``wbase``, ``sbase``: the expert's first word and first scale) for the tokens of ``live`` (rows
# ``t0 + tok`` of x and out).
HEAD = r"""
  using P = kf_mma<T>;
  constexpr int PER = 32 / BITS;        // values per word
  constexpr int HP = PER / 2;           // 16-bit pairs per word
  constexpr int SPW = PER / 4;          // mma k-steps per word
  constexpr int CK = 16 * PER;          // k values per chunk (16 words of a row)
  constexpr int CHUNKS = K / CK;
  constexpr int WPR = K / PER;          // words per row
  constexpr int GPR = K / GS;           // groups per row
  constexpr int NT = (MR + 7) / 8;      // n-tiles of 8 tokens
  constexpr int SK = TG / 32;           // warps splitting K
  constexpr int XW = 2 * PER;           // x words (2 values each) a lane reads per chunk
  // A lane's 4 words of a row's chunk, in runs of LW words GW apart. With GSUM (4 bits) each mma k-step
  // holds one group's words (LW = GS / 32: a group's share of a lane), so the mma sums a group's codes;
  // else a lane's 4 words are contiguous (one 16-byte load) and in one group
  constexpr bool SUMS = BITS == 4 && GSUM;
  constexpr int LW = SUMS ? GS / 32 : 4;
  constexpr int GW = SUMS ? GS / 8 : 16;
  constexpr int GC = 4 / LW;            // groups a chunk holds (with GSUM)
  const int lane = int(KF_LANE);
  const int warp = int(KF_WARP);
  const int g = lane >> 2;
  const int t = lane & 3;
"""

CORE = r"""
    bool live_j[NT];  // this lane's token of each n-tile: in the call (gathered: and the expert's)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      live_j[j] = live(g + 8 * j);
    }
    float acc[RT][NT][4];
#pragma unroll
    for (int r = 0; r < RT; ++r) {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          acc[r][j][e] = 0.0f;
        }
      }
    }
    for (int c0 = warp * UNR; c0 < CHUNKS; c0 += SK * UNR) {
      kf_vec<uint32_t, 4> wv[UNR][RT][2];
#pragma unroll
      for (int u = 0; u < UNR; ++u) {
        if (c0 + u < CHUNKS) {
#pragma unroll
          for (int r = 0; r < RT; ++r) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const KF_SIZE row = row0 + KF_SIZE(16 * r + g + 8 * h);
#pragma unroll
              for (int v = 0; v < 4 / LW; ++v) {
                const kf_vec<uint32_t, LW> run =
                    kf_vload<LW>(wq, (wbase + row * WPR + KF_SIZE(c0 + u) * 16 + v * GW + t * LW) / LW);
#pragma unroll
                for (int e = 0; e < LW; ++e) {
                  wv[u][r][h].v[v * LW + e] = run.v[e];
                }
              }
            }
          }
        }
      }
#pragma unroll
      for (int u = 0; u < UNR; ++u) {
        if (c0 + u < CHUNKS) {
          const int ck = (c0 + u) * CK;  // the chunk's first k
          uint32_t xp[NT][4][HP];
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            const int tok = g + 8 * j;
            uint32_t xw[XW];
#pragma unroll
            for (int v = 0; v < XW / 4; ++v) {
              kf_vec<T, 8> xv;
              if (live_j[j]) {
                // x of the lane's words in their order: value 8v of its runs of LW * PER
                const int run = (8 * v) / (LW * PER);
                const int kx = ck + (run * GW + t * LW) * PER + (8 * v) % (LW * PER);
                xv = kf_vload<8>(x, ((t0 + KF_SIZE(tok)) * K + kx) / 8);
              } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                  xv.v[e] = T(0.0f);
                }
              }
              memcpy(&xw[4 * v], &xv, 16);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
#pragma unroll
              for (int q = 0; q < HP; ++q) {
                xp[j][i][q] = __byte_perm(xw[i * HP + q / 2], xw[i * HP + q / 2 + HP / 2],
                                          (q & 1) ? 0x7632 : 0x5410);
              }
            }
          }
          if (SUMS) {
            // Per group: the mma sums (OFFSET + code) * x over the group's k (one and-or a code pair, codes
            // exact), and a mma with ones sums x; then acc += scale * that + (bias - OFFSET * scale) * sum(x)
#pragma unroll
            for (int jg = 0; jg < GC; ++jg) {
              float xs[NT][4];  // [0], [1]: sum of x over the group, tokens 2t, 2t + 1 (every row alike)
#pragma unroll
              for (int j = 0; j < NT; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                  xs[j][e] = 0.0f;
                }
#pragma unroll
                for (int w = 0; w < LW; ++w) {
#pragma unroll
                  for (int s = 0; s < SPW; ++s) {
                    P::mma(xs[j], P::ONE, P::ONE, P::ONE, P::ONE, xp[j][jg * LW + w][2 * s],
                           xp[j][jg * LW + w][2 * s + 1]);
                  }
                }
              }
              const int grp = ck / GS + jg;
#pragma unroll
              for (int r = 0; r < RT; ++r) {
                float sf[2], bf[2];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                  const KF_SIZE row = row0 + KF_SIZE(16 * r + g + 8 * h);
                  sf[h] = float(scales[sbase + row * GPR + grp]);
                  bf[h] = float(biases[sbase + row * GPR + grp]) - P::OFFSET * sf[h];
                }
                float sum[NT][4];
#pragma unroll
                for (int j = 0; j < NT; ++j) {
#pragma unroll
                  for (int e = 0; e < 4; ++e) {
                    sum[j][e] = 0.0f;
                  }
                }
#pragma unroll
                for (int w = 0; w < LW; ++w) {
                  const int i = jg * LW + w;
                  uint32_t a[2][HP];
#pragma unroll
                  for (int h = 0; h < 2; ++h) {
#pragma unroll
                    for (int q = 0; q < HP; ++q) {
                      a[h][q] = kf_and_or(wv[u][r][h].v[i] >> (4 * q), 0x000F000Fu, P::MAGIC);
                    }
                  }
#pragma unroll
                  for (int s = 0; s < SPW; ++s) {
#pragma unroll
                    for (int j = 0; j < NT; ++j) {
                      P::mma(sum[j], a[0][2 * s], a[1][2 * s], a[0][2 * s + 1], a[1][2 * s + 1],
                             xp[j][i][2 * s], xp[j][i][2 * s + 1]);
                    }
                  }
                }
#pragma unroll
                for (int j = 0; j < NT; ++j) {
#pragma unroll
                  for (int e = 0; e < 4; ++e) {
                    acc[r][j][e] = fmaf(sf[e >> 1], sum[j][e], fmaf(bf[e >> 1], xs[j][e & 1], acc[r][j][e]));
                  }
                }
              }
            }
          } else {
            // Each weight dequantized, then into the mma: at 4 bits in 16-bit pairs (one shift, one and-or
            // and one subtraction give two exact codes, one paired FMA dequantizes them); 8-bit codes do not
            // fit a 16-bit mantissa, so they go through float
            const int grp = (ck + t * 4 * PER) / GS;
#pragma unroll
            for (int r = 0; r < RT; ++r) {
              float sf[2], bf[2];
              uint32_t s2[2], b2[2];
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const KF_SIZE row = row0 + KF_SIZE(16 * r + g + 8 * h);
                sf[h] = float(scales[sbase + row * GPR + grp]);
                bf[h] = float(biases[sbase + row * GPR + grp]);
                s2[h] = P::splat(sf[h]);
                b2[h] = P::splat(bf[h]);
              }
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                uint32_t a[2][HP];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                  const uint32_t word = wv[u][r][h].v[i];
#pragma unroll
                  for (int q = 0; q < HP; ++q) {
                    if (BITS == 4) {
                      a[h][q] = kf_dequant2<T>(((word >> (4 * q)) & 0x000F000Fu) | P::MAGIC, s2[h], b2[h]);
                      continue;
                    }
                    // 2^23 + code, minus 2^23: the code as a float without a conversion
                    const uint32_t clo = (word >> (BITS * q)) & 0xFFu;
                    const uint32_t chi = (word >> (BITS * (q + HP))) & 0xFFu;
                    const float lo = KF_AS_FLOAT(clo | 0x4B000000u) - 8388608.0f;
                    const float hi = KF_AS_FLOAT(chi | 0x4B000000u) - 8388608.0f;
                    a[h][q] = P::pack(fmaf(lo, sf[h], bf[h]), fmaf(hi, sf[h], bf[h]));
                  }
                }
#pragma unroll
                for (int s = 0; s < SPW; ++s) {
#pragma unroll
                  for (int j = 0; j < NT; ++j) {
                    P::mma(acc[r][j], a[0][2 * s], a[1][2 * s], a[0][2 * s + 1], a[1][2 * s + 1],
                           xp[j][i][2 * s], xp[j][i][2 * s + 1]);
                  }
                }
              }
            }
          }
        }
      }
    }
    // acc[r][j]: rows (g, g, g+8, g+8) x tokens (2t, 2t+1, 2t, 2t+1) of row tile r, n-tile j
    constexpr int NV = RT * NT * 4;
    if (SK > 1) {
      KF_SHARED float red[SK][NV][32];
#pragma unroll
      for (int r = 0; r < RT; ++r) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            red[warp][(r * NT + j) * 4 + e][lane] = acc[r][j][e];
          }
        }
      }
      KF_BARRIER;
      for (int idx = warp; idx < NV; idx += SK) {
        float v = 0.0f;
        for (int w = 0; w < SK; ++w) {
          v += red[w][idx][lane];
        }
        const int r = idx / (NT * 4);
        const int j = (idx / 4) % NT;
        const int e = idx % 4;
        const int tok = 8 * j + 2 * t + (e & 1);
        if (live(tok)) {
          out[(t0 + KF_SIZE(tok)) * N + row0 + KF_SIZE(16 * r + g + 8 * (e >> 1))] = T(v);
        }
      }
    } else {
#pragma unroll
      for (int r = 0; r < RT; ++r) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int tok = 8 * j + 2 * t + (e & 1);
            if (live(tok)) {
              out[(t0 + KF_SIZE(tok)) * N + row0 + KF_SIZE(16 * r + g + 8 * (e >> 1))] = T(acc[r][j][e]);
            }
          }
        }
      }
    }
"""

PLAIN = r"""
  const KF_SIZE row0 = KF_SIZE(KF_GROUP) * (16 * RT);
  const KF_SIZE t0 = 0;
  {
    const KF_SIZE wbase = 0;
    const KF_SIZE sbase = 0;
    auto live = [&](int tok) { return tok < MR; };
"""

# Gathered: the grid is (row blocks) x (tiles of MR pairs); pairs come sorted by expert, so a tile holds a
# run of experts, and the block computes each one present (a tile inside one expert's run: one pass).
GATHERED = r"""
  constexpr int RB = N / (16 * RT);
  const KF_SIZE row0 = KF_SIZE(int(KF_GROUP) % RB) * (16 * RT);
  const KF_SIZE t0 = KF_SIZE(int(KF_GROUP) / RB) * MR;
  const int tn = TOKENS - int(t0) < MR ? TOKENS - int(t0) : MR;  // the pairs of this tile
  const uint32_t last = indices[t0 + tn - 1];
  for (uint32_t ex = indices[t0];;) {
    const KF_SIZE wbase = KF_SIZE(ex) * N * WPR;
    const KF_SIZE sbase = KF_SIZE(ex) * N * GPR;
    auto live = [&](int tok) { return tok < tn && indices[t0 + tok] == ex; };
"""

GATHERED_NEXT = r"""
    if (ex == last) {
      break;
    }
    uint32_t next = last;  // the tile's next expert: the first pair past this one (sorted)
    for (int i = 0; i < tn; ++i) {
      if (indices[t0 + i] > ex) {
        next = indices[t0 + i];
        break;
      }
    }
    ex = next;
    if (SK > 1) {
      KF_BARRIER;  // the split-K buffer is filled again for the next expert
    }
"""

BODY = HEAD + PLAIN + CORE + "  }\n"
GATHER_BODY = HEAD + GATHERED + CORE + GATHERED_NEXT + "  }\n"

SOURCE = KernelSource("qmm_mma", BODY, ("x", "wq", "scales", "biases"), ("out",), header=HEADER)
GATHER_SOURCE = KernelSource("gather_qmm_mma", GATHER_BODY, ("x", "wq", "scales", "biases", "indices"),
                             ("out",), header=HEADER)
