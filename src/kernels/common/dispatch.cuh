#pragma once
// Runtime values to template parameters, in one place per kind, so the values
// that size registers or loops (head dim, element type, scale rule, GQA rows)
// are compile-time constants in the hot loops. Each macro runs its body with
// the named constant defined; a value outside the list reaches the generic
// instance (head dim 0: read from the layout at run time) or the caller's
// error path, never a silent default.
#include "nvfp4kv/core/format.hpp"
#include "nvfp4kv/core/half.hpp"

// Head dims with their own instance; others run the generic one (kHeadDim = 0).
#define NVFP4KV_DISPATCH_HEAD_DIM(head_dim, kHeadDim, ...) \
  [&] {                                                   \
    switch (head_dim) {                                   \
      case 64: {                                          \
        constexpr int kHeadDim = 64;                      \
        return __VA_ARGS__();                             \
      }                                                   \
      case 128: {                                         \
        constexpr int kHeadDim = 128;                     \
        return __VA_ARGS__();                             \
      }                                                   \
      case 256: {                                         \
        constexpr int kHeadDim = 256;                     \
        return __VA_ARGS__();                             \
      }                                                   \
      default: {                                          \
        constexpr int kHeadDim = 0;                       \
        return __VA_ARGS__();                             \
      }                                                   \
    }                                                     \
  }()

// BF16 or FP16 (the launchers have refused anything else before this).
#define NVFP4KV_DISPATCH_HALF_TYPE(type, kType, ...)                      \
  [&] {                                                                   \
    if ((type) == ::nvfp4kv::ElementType::kBFloat16) {                    \
      constexpr ::nvfp4kv::ElementType kType = ::nvfp4kv::ElementType::kBFloat16; \
      return __VA_ARGS__();                                               \
    }                                                                     \
    constexpr ::nvfp4kv::ElementType kType = ::nvfp4kv::ElementType::kFloat16; \
    return __VA_ARGS__();                                                 \
  }()

#define NVFP4KV_DISPATCH_SCALE_RULE(rule, kRule, ...)                     \
  [&] {                                                                   \
    if ((rule) == ::nvfp4kv::ScaleRule::kStandard) {                      \
      constexpr ::nvfp4kv::ScaleRule kRule = ::nvfp4kv::ScaleRule::kStandard; \
      return __VA_ARGS__();                                               \
    }                                                                     \
    constexpr ::nvfp4kv::ScaleRule kRule = ::nvfp4kv::ScaleRule::kFourOverSix; \
    return __VA_ARGS__();                                                 \
  }()

// Query heads per kv head (GQA group) as the rows of one 16-row MMA tile: groups
// of 1, 2, 4 and 8 use its first 8 rows, 16 uses all of them.
#define NVFP4KV_DISPATCH_GROUP_ROWS(group, kGroupRows, ...) \
  [&] {                                                    \
    if ((group) <= 8) {                                    \
      constexpr int kGroupRows = 8;                        \
      return __VA_ARGS__();                                \
    }                                                      \
    constexpr int kGroupRows = 16;                         \
    return __VA_ARGS__();                                  \
  }()

// The attention families' head dims (core/attention.hpp: kAttentionHeadDims): the
// instance D a geometry chose, 64, 128 or 256; the planners refuse anything else
// before this.
#define NVFP4KV_DISPATCH_ATTENTION_HEAD_DIM(instance_dim, kD, ...) \
  [&] {                                                            \
    switch (instance_dim) {                                        \
      case 64: {                                                   \
        constexpr int kD = 64;                                     \
        return __VA_ARGS__();                                      \
      }                                                            \
      case 128: {                                                  \
        constexpr int kD = 128;                                    \
        return __VA_ARGS__();                                      \
      }                                                            \
      default: {                                                   \
        constexpr int kD = 256;                                    \
        return __VA_ARGS__();                                      \
      }                                                            \
    }                                                              \
  }()

// Attention's soft-cap as a compile-time policy (attention/options.cuh): off, the
// logit path has no instruction for it.
#define NVFP4KV_DISPATCH_SOFTCAP(enabled, kSoftcap, ...) \
  [&] {                                                  \
    if (enabled) {                                       \
      constexpr bool kSoftcap = true;                    \
      return __VA_ARGS__();                              \
    }                                                    \
    constexpr bool kSoftcap = false;                     \
    return __VA_ARGS__();                                \
  }()
