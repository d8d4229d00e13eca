/* Stop signals for the long-running subcommands (train, supervise). */
#ifndef ZAYA_CLI_SIGNALS_H
#define ZAYA_CLI_SIGNALS_H

#include <signal.h>

/* Installs a SIGTERM/SIGINT handler that only sets a flag, and returns that flag (0 until a signal arrives) for the
 * command to poll: the caller decides what a stop means (the trainer checkpoints and exits 0; the supervisor forwards
 * the stop to its job). The flag lives here, in the CLI layer, and is the only state the handler touches. */
volatile sig_atomic_t *cli_catch_stop_signals(void);

#endif
