# SPDX-License-Identifier: Apache-2.0
# Decides whether the CUDA backend is built, validates the target list and the compiler, and
# provides attnkit_add_cuda_sources(target sources...).

include(CheckLanguage)

# CMake's spellings of a switch (on/off, 1/0, yes/no, true/false, any case) mean ON or OFF;
# anything else but AUTO is a mistake, not a request for AUTO.
string(TOUPPER "${ATTNKIT_CUDA}" _cuda)
if(_cuda MATCHES "^(ON|1|YES|Y|TRUE)$")
  set(_cuda ON)
elseif(_cuda MATCHES "^(OFF|0|NO|N|FALSE)$")
  set(_cuda OFF)
elseif(NOT _cuda STREQUAL "AUTO")
  message(FATAL_ERROR "ATTNKIT_CUDA='${ATTNKIT_CUDA}' must be AUTO, ON or OFF (any case; also "
                      "1/0, yes/no, y/n, true/false)")
endif()

set(ATTNKIT_WITH_CUDA OFF)
if(_cuda STREQUAL "OFF")
  message(STATUS "attnkit: ATTNKIT_CUDA=${ATTNKIT_CUDA}: building the CPU backend only")
else()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(ATTNKIT_WITH_CUDA ON)
  elseif(_cuda STREQUAL "ON")
    message(FATAL_ERROR "ATTNKIT_CUDA=ON but no CUDA compiler was found (set CMAKE_CUDA_COMPILER "
                        "or put nvcc on PATH)")
  else()
    message(STATUS "attnkit: no CUDA compiler found; building the CPU backend only")
  endif()
endif()

if(ATTNKIT_WITH_CUDA)
  # Validate the requested targets before CMake turns them into -gencode flags.
  set(_archs "")
  foreach(arch IN LISTS ATTNKIT_CUDA_ARCHS)
    if(NOT arch MATCHES "^[0-9]+a?$")
      message(FATAL_ERROR "ATTNKIT_CUDA_ARCHS entry '${arch}' is not of the form 80, 90 or 90a")
    endif()
    string(REGEX REPLACE "a$" "" _num "${arch}")
    if(_num LESS 70)
      message(FATAL_ERROR "ATTNKIT_CUDA_ARCHS entry '${arch}': "
              "attnkit needs compute capability >= 7.0")
    endif()
    if(arch MATCHES "a$")
      # Arch-specific targets have no PTX fallback; emit machine code only.
      list(APPEND _archs "${arch}-real")
    else()
      list(APPEND _archs "${arch}")
    endif()
  endforeach()
  set(CMAKE_CUDA_ARCHITECTURES "${_archs}")
  enable_language(CUDA)
  if(CMAKE_CUDA_COMPILER_VERSION VERSION_LESS 12.0)
    message(FATAL_ERROR
            "attnkit needs nvcc >= 12.0 for sm_90a (found ${CMAKE_CUDA_COMPILER_VERSION})")
  endif()
  find_package(CUDAToolkit REQUIRED)
  message(STATUS
          "attnkit: CUDA ${CMAKE_CUDA_COMPILER_VERSION}, targets ${CMAKE_CUDA_ARCHITECTURES}")
endif()

# The CUDA sources build as an object library of their own, in C++17: CMake < 3.27 knows no
# CUDA20 dialect for nvcc, so the main target's C++20 requirement must not reach them. The
# headers they include are written to compile as C++17.
function(attnkit_add_cuda_sources target)
  add_library(${target}_cuda OBJECT ${ARGN})
  target_include_directories(${target}_cuda PRIVATE
    ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(${target}_cuda PRIVATE ATTNKIT_WITH_CUDA=1)
  set_target_properties(${target}_cuda PROPERTIES
    POSITION_INDEPENDENT_CODE ON CUDA_SEPARABLE_COMPILATION OFF
    CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
  set(_ptxas "")
  if(ATTNKIT_SPILL_CHECK)
    # A spill turns a register array into local-memory traffic inside the hot loop; refuse it
    # at build time (opt out with -DATTNKIT_SPILL_CHECK=OFF).
    set(_ptxas "-Xptxas=--warn-on-spills,--warning-as-error")
  endif()
  set(_werror "")
  if(ATTNKIT_WERROR)
    set(_werror "-Werror=all-warnings" "-Xcompiler=-Werror")
  endif()
  target_compile_options(${target}_cuda PRIVATE
    # Kernels compare float bit patterns as integers and must see denormals as they are.
    --ftz=false
    --expt-relaxed-constexpr
    -lineinfo
    -Xcompiler=-Wall,-Wextra
    ${_werror}
    ${_ptxas})
  target_sources(${target} PRIVATE $<TARGET_OBJECTS:${target}_cuda>)
  target_compile_definitions(${target} PUBLIC ATTNKIT_WITH_CUDA=1)
  target_link_libraries(${target} PUBLIC CUDA::cudart_static)
endfunction()
