/* main.c: the C core's unit-test runner. Add each new test function to the table. */
#include <stdio.h>

#include "ctest.h"

int ctest_failures;
int ctest_checks;

void test_tensor_validation(void);
void test_ffn_validation(void);
void test_half_rounding(void);
void test_plan_derive_errors(void);
void test_search_accounting(void);
void test_interpreter_checks(void);
void test_sha256_vectors(void);
void test_sha256_splits(void);
void test_cache_key(void);
void test_cache_entry_format(void);
void test_cache_disk(void);
void test_cache_special_files(void);
void test_cache_relabelled_entry(void);
void test_cache_secret(void);
void test_cache_root_checks(void);
void test_cache_dir_choice(void);
void test_env_flags(void);
void test_launch_config(void);
void test_launch_driver(void);
void test_ffn_prepared_launch(void);
void test_ffn_quantized_launch(void);
void test_ffn_exact_token_boxes(void);
void test_ffn_first_pass_lead(void);

static const struct { const char *name; void (*fn)(void); } tests[] = {
    {"tensor_validation", test_tensor_validation},
    {"ffn_validation", test_ffn_validation},
    {"half_rounding", test_half_rounding},
    {"plan_derive_errors", test_plan_derive_errors},
    {"search_accounting", test_search_accounting},
    {"interpreter_checks", test_interpreter_checks},
    {"sha256_vectors", test_sha256_vectors},
    {"sha256_splits", test_sha256_splits},
    {"cache_key", test_cache_key},
    {"cache_entry_format", test_cache_entry_format},
    {"cache_disk", test_cache_disk},
    {"cache_special_files", test_cache_special_files},
    {"cache_relabelled_entry", test_cache_relabelled_entry},
    {"cache_secret", test_cache_secret},
    {"cache_root_checks", test_cache_root_checks},
    {"cache_dir_choice", test_cache_dir_choice},
    {"env_flags", test_env_flags},
    {"launch_config", test_launch_config},
    {"launch_driver", test_launch_driver},
    {"ffn_prepared_launch", test_ffn_prepared_launch},
    {"ffn_quantized_launch", test_ffn_quantized_launch},
    {"ffn_exact_token_boxes", test_ffn_exact_token_boxes},
    {"ffn_first_pass_lead", test_ffn_first_pass_lead},
};

int main(int argc, char **argv)
{
    int ran = 0;
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        if (argc > 1 && !strstr(tests[i].name, argv[1]))
            continue;
        int before = ctest_failures;
        tests[i].fn();
        printf("%-32s %s\n", tests[i].name, ctest_failures == before ? "ok" : "FAILED");
        ran++;
    }
    printf("%d tests, %d checks, %d failures\n", ran, ctest_checks, ctest_failures);
    return ctest_failures ? 1 : 0;
}
