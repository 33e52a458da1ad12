// Each op kind's unit (server/models/op_unit.h) on its own: planned against
// a small config.json and checkpoint written here, run on chosen values, and
// compared with a float64 evaluation of what the op's comment says it
// computes.  Where float32 arithmetic is exact-rounded (+ - * /), float64
// then one rounding to float32 gives the same bits, so those are compared
// bit for bit; SiLU, the sinusoid, the RMSNorm and the Linear's sum are
// compared within their float32 error bounds.
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "op_unit.h"
#include "temb/kernels/cpu_backend.h"
#include "temb/kernels/linear.h"
#include "temb/models/checkpoint.h"
#include "temb/models/safetensors.h"
#include "tensor_reader.h"
#include "test_checkpoints.h"

namespace temb::models {
namespace {

// `value` (a float32) rounded to nearest even in bf16, computed in float64.
double Bf16Reference(double value) {
  if (value == 0) return value;
  const int exponent = std::max(std::ilogb(value), -126);
  const double ulp = std::ldexp(1.0, exponent - 7);
  return std::nearbyint(value / ulp) * ulp;  // ties to even by default
}

std::vector<uint8_t> Float32Bytes(const std::vector<float>& values) {
  std::vector<uint8_t> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// Values in [-2, 2) from a small generator: the same every run.
std::vector<float> Pseudorandom(int64_t count, uint32_t seed) {
  std::vector<float> values(static_cast<size_t>(count));
  for (float& value : values) {
    seed = seed * 1664525u + 1013904223u;
    value = static_cast<float>(seed >> 8) / (1 << 22) - 2.0f;
  }
  return values;
}

class OpUnitTest : public ::testing::Test {
 protected:
  // A folder with `config` and the float32 `tensors` (name, shape, values).
  void Open(const std::string& config,
            const std::vector<TensorToWrite>& tensors = {}) {
    WriteText(dir_.File("config.json"), config);
    std::vector<TensorToWrite> written = tensors;
    if (written.empty()) {
      written.push_back({"unused", DType::kFloat32, {1}, Float32Bytes({0})});
    }
    ASSERT_TRUE(WriteSafetensors(
                    dir_.File("diffusion_pytorch_model.safetensors"), written)
                    .ok());
    auto checkpoint = Checkpoint::Open(dir_.path());
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    checkpoint_ = std::move(*checkpoint);
    tensors_ = std::make_unique<TensorReader>(*checkpoint_, model_dtype_);
  }

  // `op` planned over inputs of the given shapes, in slots 0..k-1; its
  // output goes to slot k.
  std::unique_ptr<PlannedOp> Plan(const Op& op, std::vector<ValueInfo> inputs) {
    inputs_ = std::move(inputs);
    ops_.push_back(op);
    PlanContext context{family_, checkpoint_->config(), width_, *tensors_, {}};
    for (const ValueInfo& value : inputs_) context.in.push_back(&value);
    absl::StatusOr<OpPlan> plan = PlanOp(ops_.back(), context);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok() || plan->planned == nullptr) return nullptr;
    plan->planned->op = &ops_.back();
    for (size_t i = 0; i < inputs_.size(); ++i) {
      plan->planned->in.push_back(static_cast<int>(i));
      plan->planned->in_cols.push_back(inputs_[i].cols);
    }
    plan->planned->out = static_cast<int>(inputs_.size());
    plan->planned->out_cols = plan->out.cols;
    EXPECT_TRUE(plan->planned->Upload(*engine_).ok());
    out_ = plan->out;
    return std::move(plan->planned);
  }

  std::vector<float> Run(const PlannedOp& op, int64_t rows,
                         std::vector<std::vector<float>> inputs) {
    Values values = std::move(inputs);
    values.resize(values.size() + 1);
    std::unique_ptr<Backend> backend = CreateCpuBackend(1);
    const RunContext context{tensors_->model_dtype(), backend.get(),
                             engine_.get()};
    const absl::Status status = op.Run(context, rows, values);
    EXPECT_TRUE(status.ok()) << status;
    return values.back();
  }

  static ValueInfo Scalar() { return ValueInfo{}; }
  static ValueInfo Row(int64_t cols) {
    ValueInfo value;
    value.cols = cols;
    value.scalar = false;
    return value;
  }

  TempDir dir_;
  FamilyDescription family_;
  int64_t width_ = 8;
  std::optional<DType> model_dtype_;  // unset: the stored dtype (float32)
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<TensorReader> tensors_;
  std::unique_ptr<LinearEngine> engine_ = CreateCpuLinearEngine(2);
  std::vector<ValueInfo> inputs_;
  std::vector<Op> ops_ = std::vector<Op>();
  ValueInfo out_;

  void SetUp() override { ops_.reserve(16); }
};

constexpr char kConfig[] = R"({"_class_name": "Test", "scale": 0.5,
  "blocks": 3, "listed": [0, 2], "dim": 6})";

Op MakeOp(OpKind kind, std::vector<std::string> in, ValueDType dtype) {
  Op op;
  op.kind = kind;
  op.out = "y";
  op.in = std::move(in);
  op.dtype = dtype;
  return op;
}

TEST_F(OpUnitTest, CastRoundsToTheModelDTypeOnlyWhenAsked) {
  model_dtype_ = DType::kBFloat16;
  Open(kConfig);
  const std::vector<float> x = Pseudorandom(4096, 1);
  for (const ValueDType where : {ValueDType::kModel, ValueDType::kFloat32}) {
    auto op = Plan(MakeOp(OpKind::kCast, {"x"}, where), {Scalar()});
    ASSERT_NE(op, nullptr);
    const std::vector<float> y = Run(*op, 4096, {x});
    for (size_t i = 0; i < x.size(); ++i) {
      const double expected =
          where == ValueDType::kModel ? Bf16Reference(x[i]) : x[i];
      ASSERT_EQ(y[i], expected) << i;
    }
  }
}

// x op c in float64, then one rounding to float32 (and to bf16 when the op
// is in the model's dtype): exact for + - * /.
TEST_F(OpUnitTest, ConstantOpsAreFloat32ArithmeticRoundedOnce) {
  model_dtype_ = DType::kBFloat16;
  Open(kConfig);
  const std::vector<float> x = Pseudorandom(4096, 2);
  struct Case {
    OpKind kind;
    double (*reference)(double, double);
  };
  const Case cases[] = {
      {OpKind::kDivide, [](double v, double c) { return v / c; }},
      {OpKind::kMultiply, [](double v, double c) { return v * c; }},
      {OpKind::kSubtractFrom, [](double v, double c) { return c - v; }},
  };
  for (const Case& c : cases) {
    for (const ValueDType where : {ValueDType::kModel, ValueDType::kFloat32}) {
      Op op = MakeOp(c.kind, {"x"}, where);
      op.constant = 1000.1;  // rounded to float32 as PyTorch does
      auto planned = Plan(op, {Scalar()});
      ASSERT_NE(planned, nullptr);
      const std::vector<float> y = Run(*planned, 4096, {x});
      const double constant = static_cast<float>(1000.1);
      for (size_t i = 0; i < x.size(); ++i) {
        const float f32 = static_cast<float>(c.reference(x[i], constant));
        const double expected =
            where == ValueDType::kModel ? Bf16Reference(f32) : f32;
        ASSERT_EQ(y[i], expected) << static_cast<int>(c.kind) << " " << i;
      }
    }
  }
}

TEST_F(OpUnitTest, AConstantFieldReplacesTheConstant) {
  Open(kConfig);
  Op op = MakeOp(OpKind::kMultiply, {"x"}, ValueDType::kFloat32);
  op.constant = 7;
  op.constant_field = "scale";
  auto planned = Plan(op, {Scalar()});
  ASSERT_NE(planned, nullptr);
  EXPECT_EQ(Run(*planned, 2, {{3, -5}}), (std::vector<float>{1.5f, -2.5f}));
  op.constant_field = "absent";  // the constant is the default
  planned = Plan(op, {Scalar()});
  ASSERT_NE(planned, nullptr);
  EXPECT_EQ(Run(*planned, 1, {{3}}), (std::vector<float>{21}));
}

TEST_F(OpUnitTest, SiluAndAddAgainstFloat64) {
  Open(kConfig);
  const std::vector<float> a = Pseudorandom(8192, 3);
  const std::vector<float> b = Pseudorandom(8192, 4);
  auto silu =
      Plan(MakeOp(OpKind::kSilu, {"a"}, ValueDType::kFloat32), {Row(8)});
  ASSERT_NE(silu, nullptr);
  const std::vector<float> y = Run(*silu, 1024, {a});
  for (size_t i = 0; i < a.size(); ++i) {
    const double expected = a[i] / (1 + std::exp(-static_cast<double>(a[i])));
    // exp and the division each round once in float32.
    ASSERT_NEAR(y[i], expected, 3 * std::abs(expected) * 0x1p-24) << i;
  }
  auto add = Plan(MakeOp(OpKind::kAdd, {"a", "b"}, ValueDType::kFloat32),
                  {Row(8), Row(8)});
  ASSERT_NE(add, nullptr);
  const std::vector<float> sum = Run(*add, 1024, {a, b});
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(sum[i], static_cast<float>(double{a[i]} + double{b[i]})) << i;
  }
}

TEST_F(OpUnitTest, SinusoidFlattensARowAndFollowsTheConfig) {
  Open(kConfig);
  Op op = MakeOp(OpKind::kSinusoid, {"x"}, ValueDType::kFloat32);
  op.sinusoid.dim_field = "dim";
  op.sinusoid.flip_sin_to_cos = false;  // sin first
  op.sinusoid.scale = 2;
  auto planned = Plan(op, {Row(2)});
  ASSERT_NE(planned, nullptr);
  EXPECT_EQ(out_.cols, 12);  // two values, 6 columns each
  const std::vector<float> x = {0.5f, 3.25f, 9.0f, 0.0f};
  const std::vector<float> y = Run(*planned, 2, {x});
  ASSERT_EQ(y.size(), 24u);
  for (size_t v = 0; v < x.size(); ++v) {
    for (int k = 0; k < 3; ++k) {
      const double frequency = std::exp(-std::log(10000.0) * k / 3);
      const double angle = 2 * x[v] * frequency;
      EXPECT_NEAR(y[v * 6 + k], std::sin(angle), 4e-6) << v << " " << k;
      EXPECT_NEAR(y[v * 6 + 3 + k], std::cos(angle), 4e-6) << v << " " << k;
    }
  }
}

// Linear: each element within the float32 bound of its sum of products
// against float64; blocks stacked in order, rows batch-invariant.
TEST_F(OpUnitTest, StackedLinearAgainstFloat64) {
  std::vector<TensorToWrite> tensors;
  for (int i = 0; i < 3; ++i) {
    tensors.push_back({absl::StrCat("b.", i, ".w.weight"),
                       DType::kFloat32,
                       {16, 8},
                       Float32Bytes(Pseudorandom(128, 10 + i))});
    tensors.push_back({absl::StrCat("b.", i, ".w.bias"),
                       DType::kFloat32,
                       {16},
                       Float32Bytes(Pseudorandom(16, 20 + i))});
  }
  Open(kConfig, tensors);
  Op op = MakeOp(OpKind::kLinear, {"x"}, ValueDType::kFloat32);
  op.weight = "b.{i}.w";
  op.width_d = 2;
  op.blocks = "blocks";
  op.select = BlockSelect::kListed;
  op.block_list = "listed";
  auto planned = Plan(op, {Row(8)});
  ASSERT_NE(planned, nullptr);
  EXPECT_EQ(out_.blocks, 2);
  EXPECT_EQ(out_.cols, 32);
  const std::vector<float> x = Pseudorandom(5 * 8, 30);
  const std::vector<float> y = Run(*planned, 5, {x});
  int position = 0;
  for (const int block : {0, 2}) {
    const std::vector<float> w = Pseudorandom(128, 10 + block);
    const std::vector<float> b = Pseudorandom(16, 20 + block);
    for (int row = 0; row < 5; ++row) {
      for (int o = 0; o < 16; ++o) {
        double sum = b[o];
        double magnitude = std::abs(b[o]);
        for (int k = 0; k < 8; ++k) {
          sum += double{x[row * 8 + k]} * w[o * 8 + k];
          magnitude += std::abs(double{x[row * 8 + k]} * w[o * 8 + k]);
        }
        EXPECT_NEAR(y[row * 32 + position * 16 + o], sum,
                    10 * magnitude * 0x1p-24)
            << row << " " << block << " " << o;
      }
    }
    ++position;
  }
  // Each row alone gives its bits in the batch.
  for (int row = 0; row < 5; ++row) {
    const std::vector<float> one(x.begin() + row * 8, x.begin() + row * 8 + 8);
    const std::vector<float> alone = Run(*planned, 1, {one});
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), y.begin() + row * 32))
        << row;
  }
}

TEST_F(OpUnitTest, ALinearOverNoBlockIsAbsent) {
  Open(R"({"_class_name": "Test", "blocks": 2, "listed": []})",
       {{"a", DType::kFloat32, {1}, Float32Bytes({0})},
        {"b", DType::kFloat32, {1}, Float32Bytes({0})}});
  Op op = MakeOp(OpKind::kLinear, {"x"}, ValueDType::kFloat32);
  op.weight = "b.{i}.w";
  op.width_d = 1;
  op.blocks = "blocks";
  op.select = BlockSelect::kListed;
  op.block_list = "listed";
  EXPECT_EQ(Plan(op, {Row(8)}), nullptr);
}

// A config.json may claim any count: one above the tensors the checkpoint
// names is refused before anything is sized by it.
TEST_F(OpUnitTest, ABlockCountAboveTheCheckpointsTensorsIsRefused) {
  Open(R"({"_class_name": "Test", "blocks": 1000000000})");
  Op op = MakeOp(OpKind::kLinear, {"x"}, ValueDType::kFloat32);
  op.weight = "b.{i}.w";
  op.width_d = 1;
  op.blocks = "blocks";
  ops_.push_back(op);
  const ValueInfo row = Row(8);
  PlanContext context{
      family_, checkpoint_->config(), width_, *tensors_, {&row}};
  const absl::StatusOr<OpPlan> plan = PlanOp(ops_.back(), context);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()),
              ::testing::HasSubstr("blocks is 1000000000, more blocks than "
                                   "the checkpoint has tensors (1)"));
}

// A server that stops does not wait for a model's load: the reader stops
// before its next tensor.
TEST_F(OpUnitTest, ALoadStopsBeforeTheNextTensorOnceCancelled) {
  Open(
      kConfig,
      {{"table", DType::kFloat32, {2, 8}, Float32Bytes(Pseudorandom(16, 40))}});
  std::atomic<bool> cancelled{false};
  TensorReader reader(*checkpoint_, std::nullopt, &cancelled);
  EXPECT_TRUE(reader.Load("table", DType::kFloat32, {2, 8}).ok());
  cancelled = true;
  const auto stopped = reader.Load("table", DType::kFloat32, {2, 8});
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kCancelled);
}

TEST_F(OpUnitTest, TableAddRepeatsTheRowAlongTheTable) {
  Open(
      kConfig,
      {{"table", DType::kFloat32, {2, 8}, Float32Bytes(Pseudorandom(16, 40))}});
  Op op = MakeOp(OpKind::kTableAdd, {"x"}, ValueDType::kFloat32);
  op.weight = "table";
  op.table_shape = {2};
  auto planned = Plan(op, {Row(8)});
  ASSERT_NE(planned, nullptr);
  const std::vector<float> x = Pseudorandom(3 * 8, 41);
  const std::vector<float> y = Run(*planned, 3, {x});
  const std::vector<float> table = Pseudorandom(16, 40);
  ASSERT_EQ(y.size(), 48u);
  for (int row = 0; row < 3; ++row) {
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(y[row * 16 + j],
                static_cast<float>(double{x[row * 8 + j % 8]} + table[j]));
    }
  }
}

TEST_F(OpUnitTest, EmbeddingPicksTheIndexedRow) {
  family_.inputs = {{"index", "", "", "", 3}};
  Open(
      kConfig,
      {{"table", DType::kFloat32, {3, 8}, Float32Bytes(Pseudorandom(24, 50))}});
  Op op = MakeOp(OpKind::kEmbedding, {"index"}, ValueDType::kFloat32);
  op.weight = "table";
  op.table_shape = {3};
  auto planned = Plan(op, {Scalar()});
  ASSERT_NE(planned, nullptr);
  const std::vector<float> table = Pseudorandom(24, 50);
  const std::vector<float> y = Run(*planned, 3, {{2, 0, 2}});
  for (int row = 0; row < 3; ++row) {
    const int index = row == 1 ? 0 : 2;
    for (int j = 0; j < 8; ++j) EXPECT_EQ(y[row * 8 + j], table[index * 8 + j]);
  }
}

TEST_F(OpUnitTest, ConcatRangeAndRepeatBesideLayOutRows) {
  Open(kConfig);
  auto concat = Plan(MakeOp(OpKind::kConcat, {"s", "r"}, ValueDType::kFloat32),
                     {Scalar(), Row(2)});
  ASSERT_NE(concat, nullptr);
  EXPECT_EQ(Run(*concat, 2, {{1, 2}, {3, 4, 5, 6}}),
            (std::vector<float>{1, 3, 4, 2, 5, 6}));

  Op range = MakeOp(OpKind::kRange, {"s"}, ValueDType::kFloat32);
  range.constant = 1000;
  range.width_field = "blocks";
  auto planned_range = Plan(range, {Scalar()});
  ASSERT_NE(planned_range, nullptr);
  EXPECT_EQ(Run(*planned_range, 2, {{7, 8}}),
            (std::vector<float>{0, 1000, 2000, 0, 1000, 2000}));

  Op beside =
      MakeOp(OpKind::kRepeatBeside, {"t", "parts"}, ValueDType::kFloat32);
  beside.groups = 2;
  auto planned_beside = Plan(beside, {Row(1), Row(4)});
  ASSERT_NE(planned_beside, nullptr);
  EXPECT_EQ(out_.cols, 6);
  EXPECT_EQ(Run(*planned_beside, 1, {{9}, {1, 2, 3, 4}}),
            (std::vector<float>{9, 1, 2, 9, 3, 4}));
}

TEST_F(OpUnitTest, RmsNormPerGroupAgainstFloat64) {
  Open(kConfig, {{"norm.weight",
                  DType::kFloat32,
                  {8},
                  Float32Bytes(Pseudorandom(8, 60))}});
  Op op = MakeOp(OpKind::kRmsNorm, {"x"}, ValueDType::kFloat32);
  op.weight = "norm.weight";
  op.groups = 2;
  auto planned = Plan(op, {Row(16)});
  ASSERT_NE(planned, nullptr);
  const std::vector<float> x = Pseudorandom(4 * 16, 61);
  const std::vector<float> weight = Pseudorandom(8, 60);
  const std::vector<float> y = Run(*planned, 4, {x});
  for (int part = 0; part < 8; ++part) {
    double squares = 0;
    for (int k = 0; k < 8; ++k)
      squares += double{x[part * 8 + k]} * x[part * 8 + k];
    const double scale =
        1 / std::sqrt(squares / 8 + std::numeric_limits<float>::epsilon());
    for (int k = 0; k < 8; ++k) {
      const double expected = x[part * 8 + k] * scale * weight[k];
      EXPECT_NEAR(y[part * 8 + k], expected, 8 * std::abs(expected) * 0x1p-24)
          << part << " " << k;
    }
  }
}

TEST_F(OpUnitTest, ADescriptionThatCannotBePlannedIsAnInternalError) {
  Open(kConfig);
  const ValueInfo narrow = Row(4);
  const ValueInfo wide = Row(8);
  const Op add = MakeOp(OpKind::kAdd, {"a", "b"}, ValueDType::kFloat32);
  PlanContext context{
      family_, checkpoint_->config(), width_, *tensors_, {&narrow, &wide}};
  EXPECT_EQ(PlanOp(add, context).status().code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace temb::models
