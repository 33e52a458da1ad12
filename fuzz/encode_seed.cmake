# Encodes one text-format seed into the binary protobuf the fuzzer reads:
#   cmake -DPROTOC=... -DPROTO_DIR=... -DPROTO_FILE=... -DMESSAGE=...
#         -DINPUT=seed.textproto -DOUTPUT=seed -P encode_seed.cmake
execute_process(
  COMMAND "${PROTOC}" "--encode=${MESSAGE}" "-I${PROTO_DIR}" "${PROTO_FILE}"
  INPUT_FILE "${INPUT}"
  OUTPUT_FILE "${OUTPUT}"
  ERROR_VARIABLE error
  RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  file(REMOVE "${OUTPUT}")
  message(FATAL_ERROR "cannot encode ${INPUT} as ${MESSAGE}: ${error}")
endif()
