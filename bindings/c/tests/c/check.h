/* Helpers shared by the C tests: fail loudly with the library's message. */
#ifndef TC_TEST_CHECK_H
#define TC_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <torchcomms.h>

static int g_rank = -1;
static int g_failures = 0;

/* A call that must succeed: exits with its message otherwise. */
#define CHECK(call)                                                                   \
    do {                                                                              \
        tc_status_t status_ = (call);                                                 \
        if (status_ != TC_OK) {                                                       \
            fprintf(stderr, "rank %d: %s:%d: %s failed: %s: %s\n", g_rank, __FILE__,  \
                    __LINE__, #call, tc_status_string(status_), tc_last_error());     \
            exit(2);                                                                  \
        }                                                                             \
    } while (0)

/* A condition that must hold: counts a failure and goes on. */
#define EXPECT(cond, ...)                                                             \
    do {                                                                              \
        if (!(cond)) {                                                                \
            if (g_failures++ < 20) {                                                  \
                fprintf(stderr, "rank %d: %s:%d: expected %s: ", g_rank, __FILE__,    \
                        __LINE__, #cond);                                             \
                fprintf(stderr, __VA_ARGS__);                                         \
                fprintf(stderr, "\n");                                                \
            }                                                                         \
        }                                                                             \
    } while (0)

#endif
