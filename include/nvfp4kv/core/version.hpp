#pragma once
// The project's version, from CMake's project(VERSION): `nvfp4kv --version` and
// the conformance kit's manifest say which nvfp4kv made them.
#ifndef NVFP4KV_VERSION
#define NVFP4KV_VERSION "unknown"
#endif

namespace nvfp4kv {
inline constexpr const char* kVersion = NVFP4KV_VERSION;
}  // namespace nvfp4kv
