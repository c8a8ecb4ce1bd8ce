# SPDX-License-Identifier: Apache-2.0
# Configures, builds and runs tests/cmake/subproject against this source tree:
#   cmake -DSOURCE_DIR=<attnkit> -DBINARY_DIR=<scratch> -DGENERATOR=<gen> -P run_subproject.cmake
# and prints what the consumer saw and printed, for ctest's PASS_REGULAR_EXPRESSION.
file(REMOVE_RECURSE ${BINARY_DIR})
execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/cmake/subproject -B ${BINARY_DIR} -G ${GENERATOR}
          -DATTNKIT_SOURCE_DIR=${SOURCE_DIR}
  RESULT_VARIABLE rc OUTPUT_VARIABLE configure_out ERROR_VARIABLE configure_err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configure failed (${rc}):\n${configure_out}\n${configure_err}")
endif()
string(REGEX MATCH "consumer: [^\n]*" seen "${configure_out}")
message(STATUS "${seen}")
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BINARY_DIR} --target consumer
                RESULT_VARIABLE rc OUTPUT_VARIABLE build_out ERROR_VARIABLE build_err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "build failed (${rc}):\n${build_out}\n${build_err}")
endif()
execute_process(COMMAND ${BINARY_DIR}/bin/consumer RESULT_VARIABLE rc OUTPUT_VARIABLE printed)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer exited with ${rc}")
endif()
message(STATUS "consumer printed: ${printed}")
