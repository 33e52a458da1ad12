// What the subcommands build from their flags: ClientOptions (connection,
// TLS, the bearer token file), the spec request, the temb.v1 request and the
// timesteps list.
#include "temb/cli/common.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "temb/cli/args.h"
#include "temb/client/temb_client.h"
#include "temb/core/embed_service.h"
#include "temb/kernels/dtype.h"
#include "temb/kernels/embedding_spec.h"
#include "temb/v1/temb.pb.h"

namespace temb::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Flags as a subcommand declares them: connection and spec flags together.
Args ParseOrDie(const std::vector<std::string>& argv) {
  std::vector<FlagSpec> specs = ConnectionFlags();
  for (FlagSpec& spec : SpecFlags()) specs.push_back(spec);
  absl::StatusOr<Args> args = Args::Parse(specs, argv);
  EXPECT_TRUE(args.ok()) << args.status();
  return args.ok() ? *std::move(args) : Args();
}

// A scratch directory for token and timesteps files, removed afterwards.
class TempFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/temb_cli_test.XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    for (const std::string& path : written_) std::remove(path.c_str());
    rmdir(dir_.c_str());
  }
  std::string Write(const std::string& name, const std::string& contents) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << contents;
    written_.push_back(path);
    return path;
  }

  std::string dir_;
  std::vector<std::string> written_;
};

TEST(ClientOptionsFromArgsTest, DefaultsAreTheLibrarys) {
  absl::StatusOr<ClientOptions> options =
      ClientOptionsFromArgs(ParseOrDie({"--target=localhost:50051"}));
  ASSERT_TRUE(options.ok()) << options.status();
  const ClientOptions defaults;
  EXPECT_EQ(options->target, "localhost:50051");
  EXPECT_EQ(options->deadline, defaults.deadline);
  EXPECT_EQ(options->channels, defaults.channels);
  EXPECT_EQ(options->max_attempts, defaults.max_attempts);
  EXPECT_FALSE(options->tls);
  EXPECT_EQ(options->tls_ca_file, "");
  EXPECT_EQ(options->tls_cert_file, "");
  EXPECT_EQ(options->tls_key_file, "");
  EXPECT_EQ(options->tls_server_name, "");
  EXPECT_EQ(options->auth_token, "");
}

TEST(ClientOptionsFromArgsTest, EveryFlagArrives) {
  absl::StatusOr<ClientOptions> options = ClientOptionsFromArgs(ParseOrDie(
      {"--target=dns:///svc:7001", "--timeout=250ms", "--channels=4",
       "--max_attempts=1", "--tls", "--tls_ca=/ca.pem", "--tls_cert=/c.pem",
       "--tls_key=/c.key", "--tls_server_name=temb.internal"}));
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->target, "dns:///svc:7001");
  EXPECT_EQ(options->deadline, absl::Milliseconds(250));
  EXPECT_EQ(options->channels, 4);
  EXPECT_EQ(options->max_attempts, 1);
  EXPECT_TRUE(options->tls);
  EXPECT_EQ(options->tls_ca_file, "/ca.pem");
  EXPECT_EQ(options->tls_cert_file, "/c.pem");
  EXPECT_EQ(options->tls_key_file, "/c.key");
  EXPECT_EQ(options->tls_server_name, "temb.internal");
}

TEST(ClientOptionsFromArgsTest, RefusesIncompleteOptions) {
  absl::StatusOr<ClientOptions> options = ClientOptionsFromArgs(ParseOrDie({}));
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(options.status().message(), HasSubstr("--target"));

  options = ClientOptionsFromArgs(ParseOrDie({"--target="}));
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);

  for (const char* attempts : {"--max_attempts=0", "--max_attempts=-3"}) {
    options = ClientOptionsFromArgs(ParseOrDie({"--target=h:1", attempts}));
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument)
        << attempts;
    EXPECT_THAT(options.status().message(), HasSubstr("--max_attempts"));
  }

  for (const char* half : {"--tls_cert=/c.pem", "--tls_key=/c.key"}) {
    options = ClientOptionsFromArgs(ParseOrDie({"--target=h:1", half}));
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument)
        << half;
    EXPECT_THAT(options.status().message(), HasSubstr("--tls_key"));
  }
}

using AuthTokenFileTest = TempFiles;

TEST_F(AuthTokenFileTest, TheFirstLineIsTheToken) {
  struct Case {
    const char* contents;
    const char* token;
  };
  const Case cases[] = {
      {"tok-123\n", "tok-123"},
      {"tok-123", "tok-123"},                  // no final newline
      {"tok-123\r\nnext-token\n", "tok-123"},  // CRLF, a second token
      {"  tok-123 \t\nx\n", "tok-123"},        // surrounding blanks trimmed
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.contents);
    const std::string path = Write("token", c.contents);
    absl::StatusOr<ClientOptions> options = ClientOptionsFromArgs(
        ParseOrDie({"--target=h:1", "--auth_token_file=" + path}));
    ASSERT_TRUE(options.ok()) << options.status();
    EXPECT_EQ(options->auth_token, c.token);
  }
}

TEST_F(AuthTokenFileTest, AnEmptyFirstLineIsRefused) {
  // A token file whose token is on line 2 is almost certainly a mistake;
  // sending no token would fail later with a less helpful UNAUTHENTICATED.
  for (const char* contents : {"", "\n", "\ntok-123\n", "   \ntok\n", "\r\n"}) {
    SCOPED_TRACE(testing::PrintToString(contents));
    const std::string path = Write("token", contents);
    absl::StatusOr<ClientOptions> options = ClientOptionsFromArgs(
        ParseOrDie({"--target=h:1", "--auth_token_file=" + path}));
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(options.status().message(), HasSubstr(path));
    EXPECT_THAT(options.status().message(), HasSubstr("empty line"));
  }
}

TEST_F(AuthTokenFileTest, AMissingFileIsNotFound) {
  const std::string path = dir_ + "/no-such-token";
  absl::StatusOr<ClientOptions> options = ClientOptionsFromArgs(
      ParseOrDie({"--target=h:1", "--auth_token_file=" + path}));
  EXPECT_EQ(options.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(options.status().message(), HasSubstr("--auth_token_file"));
  EXPECT_THAT(options.status().message(), HasSubstr(path));
}

TEST(SpecRequestFromArgsTest, UnsetFlagsStayUnset) {
  absl::StatusOr<SpecRequest> request = SpecRequestFromArgs(ParseOrDie({}));
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->preset, "");
  EXPECT_EQ(request->dim, std::nullopt);
  EXPECT_EQ(request->max_period, std::nullopt);
  EXPECT_EQ(request->flip_sin_to_cos, std::nullopt);
  EXPECT_EQ(request->downscale_freq_shift, std::nullopt);
  EXPECT_EQ(request->scale, std::nullopt);
  EXPECT_EQ(request->time_factor, std::nullopt);
  EXPECT_EQ(request->repeat_only, std::nullopt);
  EXPECT_EQ(request->layout, std::nullopt);
  EXPECT_EQ(request->exponent_order, std::nullopt);
  EXPECT_EQ(request->precision, std::nullopt);
  EXPECT_EQ(request->dtype, std::nullopt);
  EXPECT_EQ(request->timestep_dtype, std::nullopt);
}

TEST(SpecRequestFromArgsTest, EveryFlagArrives) {
  absl::StatusOr<SpecRequest> request = SpecRequestFromArgs(
      ParseOrDie({"--preset=sdxl", "--dim=64", "--max_period=100",
                  "--noflip_sin_to_cos", "--downscale_freq_shift=1",
                  "--scale=2.5", "--time_factor=1000", "--repeat_only=false",
                  "--layout=interleaved", "--precision=fp64", "--dtype=bf16",
                  "--timestep_dtype=float16", "--exponent_order=slope_first"}));
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->preset, "sdxl");
  EXPECT_EQ(request->dim, 64);
  EXPECT_EQ(request->max_period, 100.0);
  EXPECT_EQ(request->flip_sin_to_cos, false);  // set, to false
  EXPECT_EQ(request->downscale_freq_shift, 1.0);
  EXPECT_EQ(request->scale, 2.5);
  EXPECT_EQ(request->time_factor, 1000.0);
  EXPECT_EQ(request->repeat_only, false);
  EXPECT_EQ(request->layout, Layout::kInterleaved);
  EXPECT_EQ(request->exponent_order, ExponentOrder::kSlopeFirst);
  EXPECT_EQ(request->precision, Precision::kFloat64);
  EXPECT_EQ(request->dtype, DType::kBFloat16);
  EXPECT_EQ(request->timestep_dtype, DType::kFloat16);

  request = SpecRequestFromArgs(
      ParseOrDie({"--layout=halves", "--precision=fp32", "--dtype=float64",
                  "--exponent_order=divide_last"}));
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->layout, Layout::kHalves);
  EXPECT_EQ(request->exponent_order, ExponentOrder::kDivideLast);
  EXPECT_EQ(request->precision, Precision::kFloat32);
  EXPECT_EQ(request->dtype, DType::kFloat64);
}

TEST(SpecRequestFromArgsTest, BadEnumFlagsNameTheFlagAndValue) {
  struct Case {
    const char* arg;
    const char* message;
  };
  const Case cases[] = {
      {"--layout=interleave", "--layout must be halves or interleaved"},
      {"--layout=HALVES", "got 'HALVES'"},
      {"--precision=fp16", "--precision must be fp32 or fp64, got 'fp16'"},
      {"--exponent_order=slope",
       "--exponent_order must be divide_last or slope_first, got 'slope'"},
      {"--dtype=int8", "--dtype: "},
      {"--timestep_dtype=fp8", "--timestep_dtype: "},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.arg);
    absl::StatusOr<SpecRequest> request =
        SpecRequestFromArgs(ParseOrDie({c.arg}));
    EXPECT_EQ(request.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(request.status().message(), HasSubstr(c.message));
  }
}

TEST(SpecRequestFromArgsTest, DimOutsideInt32IsRefused) {
  for (const char* dim :
       {"--dim=2147483648", "--dim=-2147483649", "--dim=9223372036854775807"}) {
    SCOPED_TRACE(dim);
    absl::StatusOr<SpecRequest> request =
        SpecRequestFromArgs(ParseOrDie({dim}));
    EXPECT_EQ(request.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(request.status().message(), HasSubstr("--dim"));
  }
  // The int32 bounds themselves pass; the server judges them.
  absl::StatusOr<SpecRequest> request =
      SpecRequestFromArgs(ParseOrDie({"--dim=2147483647"}));
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->dim, 2147483647);
}

TEST(EmbedRequestForTest, CarriesTheSpecAndTheTimesteps) {
  SpecRequest spec;
  spec.preset = "ldm";
  spec.dim = 128;
  spec.flip_sin_to_cos = false;
  spec.dtype = DType::kFloat16;
  const std::vector<float> timesteps = {0.0f, 1.5f, -3.0f, 999.0f,
                                        std::nextafter(1.0f, 2.0f)};
  const v1::EmbedRequest request = EmbedRequestFor(spec, timesteps);
  EXPECT_EQ(request.preset(), "ldm");
  EXPECT_EQ(request.spec().dim(), 128);
  ASSERT_TRUE(request.spec().has_flip_sin_to_cos());
  EXPECT_FALSE(request.spec().flip_sin_to_cos());
  EXPECT_FALSE(request.spec().has_downscale_freq_shift());
  EXPECT_FALSE(request.spec().has_max_period());
  EXPECT_EQ(request.dtype(), v1::DTYPE_FP16);
  EXPECT_THAT(request.timesteps(), ElementsAre(0.0f, 1.5f, -3.0f, 999.0f,
                                               std::nextafter(1.0f, 2.0f)));
  EXPECT_THAT(request.integer_timesteps(), IsEmpty());
  EXPECT_EQ(request.request_id(), "");

  EXPECT_THAT(EmbedRequestFor(SpecRequest(), {}).timesteps(), IsEmpty());
}

TEST(ParseTimestepsTest, CommaSeparatedList) {
  absl::StatusOr<std::vector<float>> ts = ParseTimesteps("1,2.5,999");
  ASSERT_TRUE(ts.ok()) << ts.status();
  EXPECT_THAT(*ts, ElementsAre(1.0f, 2.5f, 999.0f));

  ts = ParseTimesteps("-1e3, +0.25,\t7\n8 ,,9");
  ASSERT_TRUE(ts.ok()) << ts.status();
  EXPECT_THAT(*ts, ElementsAre(-1000.0f, 0.25f, 7.0f, 8.0f, 9.0f));

  ts = ParseTimesteps("");
  ASSERT_TRUE(ts.ok()) << ts.status();
  EXPECT_THAT(*ts, IsEmpty());
}

TEST(ParseTimestepsTest, RoundsOnceFromTheDecimalText) {
  // Just above the midpoint between 1 and the next float32: rounding to
  // double first lands exactly on the midpoint, and then to float32 rounds
  // to even (1.0); rounding once goes up.
  absl::StatusOr<std::vector<float>> ts =
      ParseTimesteps("1.00000005960464477540,0.1");
  ASSERT_TRUE(ts.ok()) << ts.status();
  ASSERT_EQ(ts->size(), 2u);
  EXPECT_EQ((*ts)[0], std::nextafter(1.0f, 2.0f));
  EXPECT_NE((*ts)[0], static_cast<float>(1.00000005960464477540));
  EXPECT_EQ((*ts)[1], 0.1f);
}

TEST(ParseTimestepsTest, NonFiniteValuesParse) {
  // The server, not the CLI, decides which values are valid.
  absl::StatusOr<std::vector<float>> ts = ParseTimesteps("nan,inf,-inf");
  ASSERT_TRUE(ts.ok()) << ts.status();
  ASSERT_EQ(ts->size(), 3u);
  EXPECT_TRUE(std::isnan((*ts)[0]));
  EXPECT_EQ((*ts)[1], std::numeric_limits<float>::infinity());
  EXPECT_EQ((*ts)[2], -std::numeric_limits<float>::infinity());
}

TEST(ParseTimestepsTest, BadNumbersAreNamed) {
  for (const char* bad : {"abc", "1.5f", "1..2", "2e", "0x", "12abc"}) {
    SCOPED_TRACE(bad);
    absl::StatusOr<std::vector<float>> ts =
        ParseTimesteps(std::string("1,") + bad + ",3");
    EXPECT_EQ(ts.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(ts.status().message(),
                HasSubstr(std::string("cannot parse '") + bad + "'"));
  }
  // Separators other than commas and whitespace are not separators.
  EXPECT_EQ(ParseTimesteps("1;2").status().code(),
            absl::StatusCode::kInvalidArgument);
}

using TimestepsFileTest = TempFiles;

TEST_F(TimestepsFileTest, ReadsNumbersFromAFile) {
  const std::string path = Write("ts.txt", "0, 1.5\n2\r\n  3\t4\n\n-5\n");
  absl::StatusOr<std::vector<float>> ts = ParseTimesteps("@" + path);
  ASSERT_TRUE(ts.ok()) << ts.status();
  EXPECT_THAT(*ts, ElementsAre(0.0f, 1.5f, 2.0f, 3.0f, 4.0f, -5.0f));

  const std::string empty = Write("empty.txt", "");
  ts = ParseTimesteps("@" + empty);
  ASSERT_TRUE(ts.ok()) << ts.status();
  EXPECT_THAT(*ts, IsEmpty());
}

TEST_F(TimestepsFileTest, FileErrors) {
  const std::string missing = dir_ + "/missing.txt";
  absl::StatusOr<std::vector<float>> ts = ParseTimesteps("@" + missing);
  EXPECT_EQ(ts.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ts.status().message(), HasSubstr(missing));

  const std::string bad = Write("bad.txt", "1\n2\nthree\n");
  ts = ParseTimesteps("@" + bad);
  EXPECT_EQ(ts.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ts.status().message(), HasSubstr("'three'"));

  // "@" is only special at the start.
  ts = ParseTimesteps("1,@" + bad);
  EXPECT_EQ(ts.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace temb::cli
