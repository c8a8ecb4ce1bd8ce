# SPDX-License-Identifier: Apache-2.0
# Builds and installs this source tree (CPU only) with dlpack/dlpack.h taken from a directory of
# its own, then configures, builds and runs tests/cmake/installed against the install:
#   cmake -DSOURCE_DIR=<attnkit> -DBINARY_DIR=<scratch> -DGENERATOR=<gen> -DDLPACK_HEADER=<file>
#         -P run_installed.cmake
# and prints what the consumer saw and printed, for ctest's PASS_REGULAR_EXPRESSION.
file(REMOVE_RECURSE ${BINARY_DIR})
file(COPY ${DLPACK_HEADER} DESTINATION ${BINARY_DIR}/dlpack-include/dlpack)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${ARGN} failed (${rc}):\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${BINARY_DIR}/attnkit -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release -DATTNKIT_CUDA=OFF -DATTNKIT_BUILD_TESTS=OFF
    -DATTNKIT_DLPACK_INCLUDE_DIR=${BINARY_DIR}/dlpack-include)
run(${CMAKE_COMMAND} --build ${BINARY_DIR}/attnkit)
run(${CMAKE_COMMAND} --install ${BINARY_DIR}/attnkit --prefix ${BINARY_DIR}/prefix)
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/cmake/installed -B ${BINARY_DIR}/consumer
    -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${BINARY_DIR}/prefix)
string(REGEX MATCH "consumer: [^\n]*" seen "${out}")
message(STATUS "${seen}")
run(${CMAKE_COMMAND} --build ${BINARY_DIR}/consumer)
run(${BINARY_DIR}/consumer/consumer)
message(STATUS "consumer printed: ${out}")
