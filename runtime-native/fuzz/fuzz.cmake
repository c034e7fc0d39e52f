# The fuzz harness of the native loaders (runtime-native/fuzz/targets.h), included by
# runtime-native/CMakeLists.txt. Nothing here is built by `all`:
#   lfc_fuzz_replay      the replay driver, built by npm test (test/fuzz/native-replay.test.ts)
#   fuzz_plan, fuzz_batch, fuzz_params
#                        libFuzzer targets, in a build configured with clang and -DLFC_FUZZ=ON,
#                        which instruments the whole runtime with ASan and UBSan (bench/fuzz.ts)
set(LFC_FUZZ_DIR ${CMAKE_CURRENT_LIST_DIR})
add_library(lfc_fuzz_targets OBJECT EXCLUDE_FROM_ALL ${LFC_FUZZ_DIR}/targets.cc)
target_link_libraries(lfc_fuzz_targets PUBLIC lfc_runtime)
target_compile_definitions(lfc_fuzz_targets PRIVATE LFC_FUZZ_SOURCE_DIR="${LFC_FUZZ_DIR}")
add_executable(lfc_fuzz_replay EXCLUDE_FROM_ALL ${LFC_FUZZ_DIR}/replay.cc)
target_link_libraries(lfc_fuzz_replay PRIVATE lfc_fuzz_targets lfc_runtime)
if(LFC_FUZZ)
  foreach(target plan batch params)
    add_executable(fuzz_${target} EXCLUDE_FROM_ALL ${LFC_FUZZ_DIR}/fuzz_${target}.cc)
    target_link_libraries(fuzz_${target} PRIVATE lfc_fuzz_targets lfc_runtime)
    target_link_options(fuzz_${target} PRIVATE -fsanitize=fuzzer)
  endforeach()
endif()
