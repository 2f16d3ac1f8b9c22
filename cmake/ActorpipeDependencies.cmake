# Finds every third-party dependency (Debian packages, CUDA when present) and
# defines imported targets for those that ship no CMake config.
include_guard(GLOBAL)

find_package(Threads REQUIRED)
find_package(fmt 9 REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(toml11 REQUIRED)
find_package(doctest REQUIRED)
include(doctest)

set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)

find_package(ucx REQUIRED)
# Gloo (Debian's libgloo-dev): its config defines the imported target gloo (headers in
# /usr/include; they warn under -Wshadow, but as an imported target's they are system headers)
find_package(Gloo REQUIRED)
find_package(OpenSSL 3 REQUIRED)  # OpenSSL::SSL: CAF's TLS module and the coordinator's checks

# oneDNN 2.6 (libdnnl-dev): the bf16 matrix products. Debian ships no CMake config for it. Its
# threading runtime is GCC's OpenMP (libgomp.so.1, whatever compiler builds actorpipe):
# kernels/bf16_gemm.cpp sets each calling thread's OpenMP budget to one thread through that
# runtime's omp_set_num_threads, since the Context partitions the work itself.
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp REQUIRED)
find_library(DNNL_LIBRARY dnnl REQUIRED)
find_library(GOMP_LIBRARY NAMES libgomp.so.1 gomp REQUIRED)
if(NOT TARGET DNNL::dnnl)
  add_library(DNNL::dnnl UNKNOWN IMPORTED)
  set_target_properties(DNNL::dnnl PROPERTIES IMPORTED_LOCATION ${DNNL_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${DNNL_INCLUDE_DIR} INTERFACE_LINK_LIBRARIES ${GOMP_LIBRARY})
endif()

# CAF 0.17.6: Debian ships neither a CMake config nor a pkg-config file.
find_path(CAF_INCLUDE_DIR caf/all.hpp REQUIRED)
find_library(CAF_CORE_LIB caf_core REQUIRED)
find_library(CAF_IO_LIB caf_io REQUIRED)
find_library(CAF_OPENSSL_LIB caf_openssl REQUIRED)
if(NOT TARGET CAF::core)
  add_library(CAF::core UNKNOWN IMPORTED)
  set_target_properties(CAF::core PROPERTIES IMPORTED_LOCATION ${CAF_CORE_LIB}
    INTERFACE_INCLUDE_DIRECTORIES ${CAF_INCLUDE_DIR} INTERFACE_LINK_LIBRARIES Threads::Threads)
  add_library(CAF::io UNKNOWN IMPORTED)
  set_target_properties(CAF::io PROPERTIES IMPORTED_LOCATION ${CAF_IO_LIB}
    INTERFACE_LINK_LIBRARIES CAF::core)
  add_library(CAF::openssl UNKNOWN IMPORTED)
  set_target_properties(CAF::openssl PROPERTIES IMPORTED_LOCATION ${CAF_OPENSSL_LIB}
    INTERFACE_LINK_LIBRARIES "CAF::io;OpenSSL::SSL")
endif()

# CUDA: AUTO builds the backend when nvcc is found, ON requires it, OFF skips it.
set(ACTORPIPE_HAVE_CUDA OFF)
if(NOT ACTORPIPE_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    if(NOT DEFINED CMAKE_CUDA_RUNTIME_LIBRARY)
      set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    endif()
    enable_language(CUDA)
    # the .cu files include the kernels' C++20 headers; CMake 3.25 knows nvcc's dialect flags
    # only up to C++17, and nvcc 12+ takes -std=c++20 (set after enable_language, whose own
    # test compile would otherwise ask for the dialect before it is defined)
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit)
    if(CUDAToolkit_FOUND)
      find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
      find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
      if(NCCL_LIBRARY AND NCCL_INCLUDE_DIR AND NOT TARGET NCCL::nccl)
        add_library(NCCL::nccl UNKNOWN IMPORTED)
        set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION ${NCCL_LIBRARY}
          INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
      endif()
      set(ACTORPIPE_HAVE_CUDA ON)
    endif()
  endif()
  if(ACTORPIPE_CUDA STREQUAL "ON" AND NOT ACTORPIPE_HAVE_CUDA)
    message(FATAL_ERROR "ACTORPIPE_CUDA=ON but no CUDA compiler/toolkit was found "
      "(looked for nvcc on PATH and /usr/local/cuda/bin/nvcc); use ACTORPIPE_CUDA=AUTO or OFF")
  endif()
endif()
message(STATUS "actorpipe: CUDA backend ${ACTORPIPE_HAVE_CUDA} (ACTORPIPE_CUDA=${ACTORPIPE_CUDA})")
