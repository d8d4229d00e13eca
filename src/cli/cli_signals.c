/* Stop signals for the long-running subcommands (src/cli/cli_signals.h). */
#include "cli_signals.h"

#include <string.h>

/* Set by SIGTERM/SIGINT. */
static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

volatile sig_atomic_t *cli_catch_stop_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    return &stop_requested;
}
