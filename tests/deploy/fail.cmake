# Fails a test with MESSAGE: how a missing tool shows up in ctest's summary.
message(FATAL_ERROR "${MESSAGE}")
