/* The lab's pause "image": PID 1 of a CRI pod sandbox. Sleeps until SIGTERM/SIGINT,
 * reaps children (it is the pod's init when the PID namespace is shared). */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) { (void)sig; _exit(0); }
static void on_chld(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(void)
{
    struct sigaction term = {.sa_handler = on_term}, chld = {.sa_handler = on_chld, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGTERM, &term, NULL);
    sigaction(SIGINT, &term, NULL);
    sigaction(SIGCHLD, &chld, NULL);
    for (;;)
        pause();
    return 0;
}
