# The CPU unit tests of the modules this project builds, linked against its sanitized libraries
# (tests/fuzz/CMakeLists.txt with -DDI_UNIT_TESTS=ON; tools/sanitizers.sh and .ci/run drive it).
# DI_SAN_MODE=address: ASan + UBSan (the libraries the fuzz targets already compiled are reused:
# only the test sources are new). DI_SAN_MODE=thread: TSan, with LLVM's OpenMP so parallel_for
# regions are checked (run with OMP_TOOL_LIBRARIES=libarcher.so).
find_package(GTest REQUIRED)
set(DI_TESTS ${DI_ROOT}/tests/cpp)

function(di_san_test name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(san_${name} ${T_SOURCES})
  target_link_libraries(san_${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  target_include_directories(san_${name} PRIVATE ${DI_TESTS})
  add_dependencies(san_tests san_${name})
endfunction()
add_custom_target(san_tests)

di_san_test(core_test SOURCES ${DI_TESTS}/core/tensor_test.cc ${DI_TESTS}/core/numeric_test.cc ${DI_TESTS}/core/json_test.cc
  LIBS fz_core)
di_san_test(io_test SOURCES ${DI_TESTS}/io/safetensors_test.cc ${DI_TESTS}/io/safetensors_hostile_test.cc LIBS fz_io)
di_san_test(tokenizer_test SOURCES ${DI_TESTS}/tokenizer/tokenizer_test.cc ${DI_TESTS}/tokenizer/tokenizer_hostile_test.cc
  LIBS fz_tokenizer)
# As tests/cpp/structured groups them (structured_tracked_test: the hardening and worker tests).
di_san_test(structured_test SOURCES ${DI_TESTS}/structured/tracked_object_test.cc ${DI_TESTS}/structured/draft_semantics_test.cc
  ${DI_TESTS}/structured/hardening_test.cc ${DI_TESTS}/structured/number_spelling_test.cc ${DI_TESTS}/structured/trigger_test.cc
  ${DI_TESTS}/structured/workers_test.cc LIBS fz_structured)
di_san_test(structured_basic_test SOURCES ${DI_TESTS}/structured/structured_test.cc LIBS fz_structured)
di_san_test(server_test SOURCES ${DI_TESTS}/server/chat_parser_test.cc ${DI_TESTS}/server/tool_grammar_test.cc
  ${DI_TESTS}/server/request_test.cc LIBS fz_server fz_structured)
if(DI_SAN_MODE STREQUAL "thread")
  # The CPU ops: their parallel_for (OpenMP) regions.
  find_library(DI_OPENBLAS openblas)
  file(GLOB FZ_OPS_SOURCES CONFIGURE_DEPENDS ${DI_SRC}/ops/cpu/*.cpp)
  add_library(fz_ops_cpu STATIC ${FZ_OPS_SOURCES})
  target_link_libraries(fz_ops_cpu PUBLIC fz_core)
  if(DI_OPENBLAS)
    target_compile_definitions(fz_ops_cpu PRIVATE DEEPINFER_HAVE_BLAS=1)
    target_include_directories(fz_ops_cpu PRIVATE /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/openblas)
    target_link_libraries(fz_ops_cpu PUBLIC ${DI_OPENBLAS})
  endif()
  file(GLOB FZ_OPS_TESTS CONFIGURE_DEPENDS ${DI_TESTS}/ops/*_test.cc)
  list(REMOVE_ITEM FZ_OPS_TESTS ${DI_TESTS}/ops/qat_test.cc)
  di_san_test(ops_cpu_test SOURCES ${FZ_OPS_TESTS} LIBS fz_ops_cpu)
endif()
