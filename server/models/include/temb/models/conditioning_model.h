// A model's time conditioning computed from its own diffusers checkpoint:
// the family's description (family.h) evaluated on the CPU over the
// checkpoint's tensors (loader.cc plans it, evaluator.cc runs it, each op
// kind a unit of ops/), in the model's dtype, exactly as diffusers' own
// forward computes it up to the summation order of a Linear (see
// docs/conditioning.md for the measured agreement).
//
// Loading reads config.json, picks the family by `_class_name`, and reads
// the tensors the family needs, and only those, in their stored dtype or,
// with a torch_dtype (the option, else the folder's temb.json), converted
// once to it.
// Compute() evaluates the requested outputs for N rows.  Rows whose
// values depend on the timestep (and guidance) alone are computed once per
// distinct input and, with a RowCache, once per process.
#ifndef TEMB_MODELS_CONDITIONING_MODEL_H_
#define TEMB_MODELS_CONDITIONING_MODEL_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "temb/kernels/backend.h"
#include "temb/kernels/dtype.h"
#include "temb/kernels/linear_engine.h"
#include "temb/models/checkpoint.h"
#include "temb/models/family.h"
#include "temb/models/row_cache.h"

namespace temb::models {

// Rows in one Compute() call: a FLUX.1 row is about 2 MiB of bf16 outputs.
inline constexpr int64_t kMaxConditioningRows = 4096;

// A config.json field's JSON text is published (config_fields()) up to this
// size: the fields a description reads are flags, sizes and short lists.
inline constexpr size_t kMaxPublishedConfigBytes = 1024;

struct ConditioningOptions {
  int threads = 1;
  // Shared by every model that is given it; null: no cache (rows are still
  // computed once per distinct input within a call).
  std::shared_ptr<RowCache> cache;
  // Where the Linear layers run: null, the CPU engine on `threads` threads
  // (CreateCpuLinearEngine), which reads the checkpoint's host memory; else
  // this engine, which may copy every Linear's parameters at load (the host
  // copy is then released).
  std::shared_ptr<LinearEngine> linear_engine;
  // The dtype the model computes in, as diffusers' from_pretrained(
  // torch_dtype=...) sets it: every tensor the family reads is converted
  // once at load (rounded to nearest even, as torch's .to(dtype)) and only
  // the converted copy is kept, except those of the modules the family
  // keeps in float32, which stay float32.  Overrides the folder's
  // temb.json (checkpoint.h); unset there too: the stored dtype.  fp32,
  // bf16 or fp16.
  std::optional<DType> torch_dtype;
  // Set true by another thread: the load stops before its next tensor
  // with CANCELLED (a server shutting down does not wait for a model).
  const std::atomic<bool>* cancelled = nullptr;
  // Past this time the load stops before its next tensor with
  // DEADLINE_EXCEEDED (a slow folder does not hold a loader forever).
  absl::Time deadline = absl::InfiniteFuture();
};

// The inputs, as float32 values, by their InputSpec name ("t", "guidance",
// "pooled", a family's extras): which ones a model takes is its family's
// InputSpec list (active ones: active_inputs()).  Each is [N] or [N, W]
// row-major, or one value (one row of W) that every row shares; "t" alone
// sets N.
struct ConditioningInputs {
  std::map<std::string, std::vector<float>> values;

  // The values of `name`, or an empty vector.
  const std::vector<float>& Get(const std::string& name) const;
};

// What a model takes and gives, per row, for a service to describe it and
// to bound a request's memory before computing.
struct InputInfo {
  std::string name;
  int64_t width = 0;  // 0: one value per row ([N]); else [N, width]
  std::string help;
  // Set: this input stands for a value of the computation
  // (InputSpec::stands_for) and is given instead of the input `instead_of`;
  // one standing in for "t" sets N as "t" does.
  std::string stands_for;
  std::string instead_of;
  // Where an offload patch captures it (InputSpec::module, ::argument).
  std::string module;
  std::string argument;
  bool in_model_dtype = false;  // InputSpec::in_model_dtype
};

struct OutputInfo {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> row_shape;  // the output's shape without N
  int64_t row_bytes = 0;
  std::string layout;
  // What the output stands for in the transformer, so that a client can
  // drop those weights: `replaces` is a module ("embedder": the module that
  // returns this output; "linear": the Linear that computes it) or a
  // parameter ("table": the table the model adds, the output being the
  // sum), with "{i}" for a stacked output's block; `blocks` then gives the
  // i of each row along L.  Empty for an output that stands for no module.
  std::string replaces;
  std::string replaced_kind;
  std::vector<int64_t> blocks;
  // A Linear's parameterless input module (Op::input_module), "{i}" as in
  // `replaces`.
  std::string input_module;
  // The embedder's result the replaced module is handed
  // (OutputSpec::embedding), where the embedder returns several.
  std::string embedding;
};

// A module with weights that the outputs fold in (FoldedModule), as a
// client replaces it: kind "passes_on" or "adds_nothing".
struct FoldedModuleInfo {
  std::string module;
  std::string kind;
};

struct ConditioningOutput {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  // Little-endian elements of dtype, in the string the frontends pass on
  // (moved, not copied, into an answer).
  std::string data;
};

struct ModelGraph;

class ConditioningModel {
 public:
  // NOT_FOUND when the folder has no weights; INVALID_ARGUMENT naming the
  // file and field for a malformed or unsupported checkpoint (an unknown
  // `_class_name` lists the known ones).
  static absl::StatusOr<std::unique_ptr<ConditioningModel>> Load(
      const std::string& dir, const ConditioningOptions& options);
  ~ConditioningModel();

  const FamilyDescription& family() const { return *family_; }
  DType dtype() const { return dtype_; }
  int64_t width() const { return width_; }  // D
  const std::vector<InputSpec>& active_inputs() const;
  // The inputs this model takes and the outputs it gives, in the family's
  // order.
  std::vector<InputInfo> inputs() const;
  std::vector<OutputInfo> outputs() const;
  // The modules with weights this model's outputs fold in besides their
  // own (FamilyDescription::folded, those present in this model).
  std::vector<FoldedModuleInfo> folded_modules() const;
  // Where the replaced embedder returns a tuple: the output at each
  // position, "" where it returns None (FamilyDescription::
  // embedder_results); empty when it returns one tensor.
  std::vector<std::string> embedder_results() const;
  // The config.json fields this model's description read, each as its
  // JSON text (those longer than kMaxPublishedConfigBytes left out): a
  // client can tell a transformer built from another config.
  const std::map<std::string, std::string>& config_fields() const {
    return config_fields_;
  }
  // An upper bound on the float32 values Compute() holds per row (every
  // value the description computes), not counting the outputs' encoding.
  int64_t working_bytes_per_row() const;
  // Bytes of checkpoint tensors held.
  int64_t weight_bytes() const { return weight_bytes_; }
  // Each tensor read, by checkpoint name: WeightFingerprint of its bytes
  // in the dtype computed with (weight_fingerprint.h).
  const std::map<std::string, std::string>& weight_fingerprints() const {
    return weight_fingerprints_;
  }
  const std::string& cache_key() const { return cache_key_; }

  // The outputs named in `names` (all of the family's when empty), each
  // [N, W] or [N, L, W] in dtype().  A name may also be any value the
  // family's description computes (e.g. "t_emb"), with the dtype it is
  // rounded to: [N] for a scalar, [N, W] otherwise.  INVALID_ARGUMENT naming
  // the input and index for a non-finite value, a wrong size, a missing or
  // unexpected input, or an unknown output name; RESOURCE_EXHAUSTED above
  // kMaxConditioningRows.  Thread-safe.
  absl::StatusOr<std::vector<ConditioningOutput>> Compute(
      const ConditioningInputs& inputs,
      const std::vector<std::string>& names) const;

 private:
  ConditioningModel() = default;

  const FamilyDescription* family_ = nullptr;
  ConditioningOptions options_;
  DType dtype_ = DType::kFloat32;
  // Set: every tensor read in the model's dtype is converted to it.
  std::optional<DType> torch_dtype_;
  int64_t width_ = 0;
  int64_t weight_bytes_ = 0;
  std::map<std::string, std::string> weight_fingerprints_;
  std::map<std::string, std::string> config_fields_;
  std::string cache_key_;
  // The description resolved against this model (model_graph.h).
  std::unique_ptr<const ModelGraph> graph_;
  std::unique_ptr<Backend> sinusoid_backend_;
  std::shared_ptr<LinearEngine> linear_engine_;  // every Linear uploaded
};

}  // namespace temb::models

#endif  // TEMB_MODELS_CONDITIONING_MODEL_H_
