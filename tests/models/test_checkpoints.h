// Small checkpoints written by the tests themselves, for the loader, the
// model's evaluation and the service over it.
#ifndef TEMB_TESTS_MODELS_TEST_CHECKPOINTS_H_
#define TEMB_TESTS_MODELS_TEST_CHECKPOINTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "temb/models/safetensors.h"

namespace temb::models {

// A fresh folder under /tmp, removed with everything in it at the end.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string File(const std::string& name) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void WriteText(const std::string& path, const std::string& text);

// A safetensors file with `header` as its JSON, `data_bytes` zero bytes
// after it, and `length` (default: the header's size) as the length field.
void WriteRaw(const std::string& path, const std::string& header,
              size_t data_bytes, int64_t length = -1);

// An fp32 tensor of values in [-0.5, 0.5) from a small linear congruential
// generator: the same weights on every run, without a file of them.
TensorToWrite RandomFloat32(const std::string& name, std::vector<int64_t> shape,
                            uint32_t* state);

// A small valid single-file checkpoint of a Qwen-Image-shaped model with
// D = 8, two blocks, float32, in `dir`.  `bad` damages it: 1 gives the
// first Linear the wrong input width, 2 leaves a block's txt_mod out.
void WriteQwenCheckpoint(const std::string& dir, int bad = 0);

}  // namespace temb::models

#endif  // TEMB_TESTS_MODELS_TEST_CHECKPOINTS_H_
