# What `cmake --install` puts in place for an engine's build:
#   include/nvfp4kv/...                     the public headers (core, api, reference)
#   lib/libnvfp4kv_{core,reference,conformance,cuda}.a  position-independent static libraries
#   lib/cmake/nvfp4kv/                      nvfp4kvConfig.cmake, its version file, the targets
#   bin/nvfp4kv                             the CLI (component "tools")
# so that an engine says find_package(nvfp4kv CONFIG) and links nvfp4kv::cuda
# (kernels and host API), nvfp4kv::reference, nvfp4kv::conformance (the kit and
# its checks, to run an engine's own writer and reader in its tests) or
# nvfp4kv::core. The harness is
# test and tool code and stays out.
include(CMakePackageConfigHelpers)

set(NVFP4KV_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/nvfp4kv)
set(_nvfp4kv_installed nvfp4kv_headers nvfp4kv_core nvfp4kv_reference nvfp4kv_conformance)
if(NVFP4KV_HAVE_CUDA)
  list(APPEND _nvfp4kv_installed nvfp4kv_cuda)
endif()

install(DIRECTORY include/nvfp4kv DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT devel
        PATTERN "harness" EXCLUDE)
install(TARGETS ${_nvfp4kv_installed} EXPORT nvfp4kvTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT devel
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT nvfp4kvTargets NAMESPACE nvfp4kv:: DESTINATION ${NVFP4KV_CMAKE_DIR} COMPONENT devel)
if(TARGET nvfp4kv)
  install(TARGETS nvfp4kv RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
endif()

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/nvfp4kvConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/nvfp4kvConfig.cmake
                              INSTALL_DESTINATION ${NVFP4KV_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/nvfp4kvConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/nvfp4kvConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/nvfp4kvConfigVersion.cmake
        DESTINATION ${NVFP4KV_CMAKE_DIR} COMPONENT devel)
