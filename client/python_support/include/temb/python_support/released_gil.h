// The GIL released around a blocking native call, for the Python client's
// extensions (temb.local's engine, temb.Client's native transport).
//
// A daemon thread may still be inside such a call when the interpreter
// exits.  Taking the GIL back then ends the thread with pthread_exit
// (CPython's rule for a thread that wants the GIL after finalization has
// begun), and that forced unwinding through a noexcept destructor, such as
// pybind11's gil_scoped_release's, calls std::terminate: the whole process
// dies with SIGABRT ("terminate called without an active exception")
// instead of exiting.  So once the interpreter is finalizing, the thread
// never takes the GIL back and waits for the process to end, as CPython's
// own daemon threads do from 3.14 on; and in case finalization begins just
// after that check, the destructor may be unwound through.
#ifndef TEMB_PYTHON_SUPPORT_RELEASED_GIL_H_
#define TEMB_PYTHON_SUPPORT_RELEASED_GIL_H_

#include <Python.h>
#include <unistd.h>

namespace temb::python_support {

class ReleasedGil {
 public:
  ReleasedGil() : state_(PyEval_SaveThread()) {}
  ReleasedGil(const ReleasedGil&) = delete;
  ReleasedGil& operator=(const ReleasedGil&) = delete;
  // noexcept(false): pthread_exit's forced unwinding may pass through.
  ~ReleasedGil() noexcept(false) {
    if (Finalizing()) {
      for (;;) pause();  // the process ends around this thread
    }
    PyEval_RestoreThread(state_);
  }

 private:
  static bool Finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
  }

  PyThreadState* state_;
};

}  // namespace temb::python_support

#endif  // TEMB_PYTHON_SUPPORT_RELEASED_GIL_H_
