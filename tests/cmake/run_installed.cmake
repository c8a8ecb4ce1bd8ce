# SPDX-License-Identifier: Apache-2.0
# Builds and installs this source tree (CPU only, Release) with dlpack/dlpack.h taken from a
# directory of its own, then configures, builds and runs tests/cmake/installed against the
# install:
#   cmake -DSOURCE_DIR=<attnkit> -DBINARY_DIR=<scratch> -DGENERATOR=<gen> -DDLPACK_HEADER=<file>
#         [-DCXX_COMPILER=<c++>] -P run_installed.cmake
# and prints what the consumer saw and printed, for ctest's PASS_REGULAR_EXPRESSION.
cmake_minimum_required(VERSION 3.24)
file(REMOVE_RECURSE ${BINARY_DIR})
set(dlpack_dir ${BINARY_DIR}/dlpack-include)
file(COPY ${DLPACK_HEADER} DESTINATION ${dlpack_dir}/dlpack)
set(compiler "")
if(CXX_COMPILER)
  set(compiler -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
endif()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${ARGN} failed (${rc}):\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${BINARY_DIR}/attnkit -G ${GENERATOR} ${compiler}
    -DCMAKE_BUILD_TYPE=Release -DATTNKIT_CUDA=OFF -DATTNKIT_BUILD_TESTS=OFF
    -DATTNKIT_DLPACK_INCLUDE_DIR=${dlpack_dir})
run(${CMAKE_COMMAND} --build ${BINARY_DIR}/attnkit --config Release)
run(${CMAKE_COMMAND} --install ${BINARY_DIR}/attnkit --config Release
    --prefix ${BINARY_DIR}/prefix)
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/cmake/installed -B ${BINARY_DIR}/consumer
    -G ${GENERATOR} ${compiler} -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${BINARY_DIR}/prefix)
string(REGEX MATCH "consumer: [^\n]*" seen "${out}")
message(STATUS "${seen}")
# The consumer's include directories must hold the one the build compiled against.
string(REGEX MATCH "consumer includes: [^\n]*" includes "${out}")
string(REPLACE "consumer includes: " "" includes "${includes}")
if(dlpack_dir IN_LIST includes)
  message(STATUS "consumer includes the build's dlpack directory")
else()
  message(STATUS "consumer includes ${includes}, not ${dlpack_dir}")
endif()
run(${CMAKE_COMMAND} --build ${BINARY_DIR}/consumer --config Release)
run(${BINARY_DIR}/consumer/bin/consumer)
message(STATUS "consumer printed: ${out}")
