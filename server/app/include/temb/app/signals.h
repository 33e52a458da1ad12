// Termination signals handled without work in a signal handler: SIGTERM and
// SIGINT are blocked in every thread and collected with sigwait().
#ifndef TEMB_APP_SIGNALS_H_
#define TEMB_APP_SIGNALS_H_

namespace temb {

// Blocks SIGTERM and SIGINT in the calling thread; threads created afterwards
// inherit the mask.  Call first thing in main(), before any thread starts.
void BlockTerminationSignals();

// Waits for SIGTERM or SIGINT and returns its number.
int WaitForTerminationSignal();

}  // namespace temb

#endif  // TEMB_APP_SIGNALS_H_
