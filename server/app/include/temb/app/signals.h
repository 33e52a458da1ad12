// Termination signals handled without work in a signal handler: SIGTERM,
// SIGINT and SIGHUP are blocked in every thread and collected with
// sigwait().  SIGHUP's default action would kill the process at once; here
// it drains like SIGTERM.
#ifndef TEMB_APP_SIGNALS_H_
#define TEMB_APP_SIGNALS_H_

namespace temb {

// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread; threads created
// afterwards inherit the mask.  Call first thing in main(), before any thread
// starts.
void BlockTerminationSignals();

// Waits for SIGTERM, SIGINT or SIGHUP and returns its number.
int WaitForTerminationSignal();

}  // namespace temb

#endif  // TEMB_APP_SIGNALS_H_
