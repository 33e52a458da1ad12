// The libFuzzer entry points of the fuzzers whose input is one serialised
// protobuf message: each fuzzer's LLVMFuzzerInitialize and
// LLVMFuzzerTestOneInput forward here.
#ifndef TEMB_FUZZ_PROTO_INPUT_H_
#define TEMB_FUZZ_PROTO_INPUT_H_

#include <cstddef>
#include <cstdint>

#include "google/protobuf/stubs/logging.h"

namespace temb::fuzz {

// Parse warnings (e.g. invalid UTF-8 in a string field) are expected from
// fuzzed bytes: silenced once, at start-up.  Returns 0 for libFuzzer.
inline int SilenceProtobufLogs() {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

// Parses `data` as a `Message` and hands it to `run`; bytes that are not
// such a message are skipped.  Returns 0 for libFuzzer.
template <typename Message>
int RunOnMessage(const uint8_t* data, size_t size,
                 void (*run)(const Message&)) {
  Message message;
  if (message.ParseFromArray(data, static_cast<int>(size))) run(message);
  return 0;
}

}  // namespace temb::fuzz

#endif  // TEMB_FUZZ_PROTO_INPUT_H_
