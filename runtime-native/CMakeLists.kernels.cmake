# The CPU kernel library of lfc's native runtime: include() this file from a CMakeLists.txt.
#
# Defines
#   LFC_CPU_KERNEL_SOURCES       the .cc files (absolute paths)
#   LFC_CPU_KERNEL_HEADERS       the public headers (absolute paths)
#   LFC_CPU_KERNEL_INCLUDE_DIR   add to the include path; headers are "kernels/cpu/<family>.h"
#                                (they use the header-only core/dtype.h and core/bf16.h, and
#                                core/thread_pool.{h,cc}, the pool of the non-GEMM kernels)
#   target lfc_cpu_kernels       a static library of the above, linked to CBLAS (OpenBLAS),
#                                unless a target of that name exists already
# Needs a C++17 compiler and OpenBLAS (Debian: apt-get install libopenblas-dev).

set(LFC_CPU_KERNEL_DIR ${CMAKE_CURRENT_LIST_DIR}/src/kernels/cpu)
set(LFC_CPU_KERNEL_INCLUDE_DIR ${CMAKE_CURRENT_LIST_DIR}/src)
# storage: the dtype-tagged operands and dispatch every family's entry points use (not an op family)
set(LFC_CPU_KERNEL_FAMILIES
  storage linear norm embedding activation rope attention moe loss optimizer merge balance)

set(LFC_CPU_KERNEL_SOURCES ${LFC_CPU_KERNEL_INCLUDE_DIR}/core/thread_pool.cc)
set(LFC_CPU_KERNEL_HEADERS ${LFC_CPU_KERNEL_DIR}/common.h ${LFC_CPU_KERNEL_DIR}/simd.h ${LFC_CPU_KERNEL_INCLUDE_DIR}/core/bf16.h
  ${LFC_CPU_KERNEL_INCLUDE_DIR}/core/dtype.h ${LFC_CPU_KERNEL_INCLUDE_DIR}/core/thread_pool.h)
foreach(family IN LISTS LFC_CPU_KERNEL_FAMILIES)
  list(APPEND LFC_CPU_KERNEL_SOURCES ${LFC_CPU_KERNEL_DIR}/${family}.cc)
  list(APPEND LFC_CPU_KERNEL_HEADERS ${LFC_CPU_KERNEL_DIR}/${family}.h)
endforeach()

if(NOT TARGET lfc_cpu_kernels)
  find_package(Threads REQUIRED)
  set(BLA_VENDOR OpenBLAS)
  find_package(BLAS REQUIRED)
  # cblas.h: on Debian in the multiarch include dir (found by default), elsewhere under openblas/
  find_path(LFC_CBLAS_INCLUDE_DIR cblas.h
    PATH_SUFFIXES openblas openblas-pthread x86_64-linux-gnu x86_64-linux-gnu/openblas-pthread
    REQUIRED)

  add_library(lfc_cpu_kernels STATIC ${LFC_CPU_KERNEL_SOURCES} ${LFC_CPU_KERNEL_DIR}/blas.h)
  target_compile_features(lfc_cpu_kernels PUBLIC cxx_std_17)
  target_include_directories(lfc_cpu_kernels PUBLIC ${LFC_CPU_KERNEL_INCLUDE_DIR})
  target_include_directories(lfc_cpu_kernels PRIVATE ${LFC_CBLAS_INCLUDE_DIR})
  target_link_libraries(lfc_cpu_kernels PUBLIC ${BLAS_LIBRARIES} Threads::Threads)
  set_target_properties(lfc_cpu_kernels PROPERTIES POSITION_INDEPENDENT_CODE ON)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    # no errno and no FP traps (lfc never reads either): loops over exp_approx and over clamps
    # if-convert and vectorize, the values unchanged; the ISA clones are simd.h's
    target_compile_options(lfc_cpu_kernels PRIVATE -Wall -Wextra -fno-math-errno -fno-trapping-math)
  endif()
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
    target_compile_options(lfc_cpu_kernels PRIVATE -march=x86-64-v2)
  endif()
endif()
