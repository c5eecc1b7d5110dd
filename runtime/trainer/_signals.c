/* A pserver's exit on SIGTERM (runtime/trainer/native.py, exit_on_signal).
 *
 * Paddle 3.0.0's fleet.run_server() blocks in C++ for the life of a pserver while holding
 * Python's GIL, so no Python code (a signal handler, a sigwait thread) can run once it
 * started. A pserver has nothing in flight to finish when it is stopped (the trainers save
 * its tables), so the handler ends the process at once with the given exit code.
 * Only async-signal-safe calls (_exit). */
#include <signal.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t exit_code = 0;

static void exit_now(int sig) {
    (void)sig;
    _exit(exit_code);
}

/* Installs the handler for `sig` and unblocks it in the calling thread; 0 or -1 (errno). */
int elastic_ctr_exit_on_signal(int sig, int code) {
    struct sigaction sa;
    sigset_t set;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = exit_now;
    sigemptyset(&sa.sa_mask);
    exit_code = code;
    if (sigaction(sig, &sa, NULL) != 0) return -1;
    sigemptyset(&set);
    sigaddset(&set, sig);
    return pthread_sigmask(SIG_UNBLOCK, &set, NULL) == 0 ? 0 : -1;
}
