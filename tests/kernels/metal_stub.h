// Minimal stand-in for the Metal Shading Language (plus MLX's utils header) so that rendered MSL
// can be syntax- and type-checked as C++ with g++ off a Mac. Only what the catalog uses.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

// Address spaces and function qualifiers vanish; [[kernel]] becomes [[]], other [[attributes]]
// are ignored (-Wno-attributes).
#define device
#define constant
#define threadgroup
#define thread
#define kernel

typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
struct uint3 { uint x, y, z; };
struct uint2 { uint x, y; };

typedef _Float16 half;
typedef half float16_t;

// MLX's bfloat16_t: a 16-bit struct converting to and from float.
struct bfloat16_t {
  uint16_t bits_;
  bfloat16_t() = default;
  bfloat16_t(float x) : bits_(uint16_t(0)) { (void)x; }
  operator float() const { return 0.0f; }
};

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2 };
void threadgroup_barrier(mem_flags);

float simd_sum(float);
float simd_max(float);
template <typename U> U simd_shuffle_xor(U v, ushort mask);

namespace metal {
float exp(float); float log(float); float sqrt(float); float rsqrt(float); float tanh(float);
float cos(float); float sin(float); float pow(float, float);
float abs(float); float fma(float, float, float);
template <typename U> U max(U a, U b);
template <typename U> U min(U a, U b);
namespace precise {
float exp(float); float log(float); float sqrt(float); float rsqrt(float); float tanh(float);
float cos(float); float sin(float); float pow(float, float);
}  // namespace precise
}  // namespace metal
