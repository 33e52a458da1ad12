// The CLI's flag parser: every accepted form, and every malformed command
// line refused up front with a message naming the flag.
#include "temb/cli/args.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace temb::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Optional;

const std::vector<FlagSpec>& Specs() {
  static const auto* const specs = new std::vector<FlagSpec>{
      {"target", FlagType::kString, "server"},
      {"dim", FlagType::kInt, "width"},
      {"scale", FlagType::kDouble, "angle factor"},
      {"tls", FlagType::kBool, "use TLS"},
      {"timeout", FlagType::kDuration, "deadline"},
  };
  return *specs;
}

absl::StatusOr<Args> Parse(const std::vector<std::string>& argv) {
  return Args::Parse(Specs(), argv);
}

// The error of a command line that must not parse.
std::string ErrorOf(const std::vector<std::string>& argv) {
  absl::StatusOr<Args> args = Parse(argv);
  EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(args.status().message());
}

TEST(ArgsTest, NothingGivenIsNothingSet) {
  absl::StatusOr<Args> args = Parse({});
  ASSERT_TRUE(args.ok()) << args.status();
  for (const FlagSpec& spec : Specs()) EXPECT_FALSE(args->Has(spec.name));
  EXPECT_EQ(args->String("target"), std::nullopt);
  EXPECT_EQ(args->Int("dim"), std::nullopt);
  EXPECT_EQ(args->Double("scale"), std::nullopt);
  EXPECT_EQ(args->Bool("tls"), std::nullopt);
  EXPECT_EQ(args->Duration("timeout"), std::nullopt);
}

TEST(ArgsTest, ValueForms) {
  absl::StatusOr<Args> args =
      Parse({"--target=host:1", "--dim", "320", "-scale=0.5", "--timeout",
             "1.5s", "--tls"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_THAT(args->String("target"), Optional(std::string("host:1")));
  EXPECT_THAT(args->Int("dim"), Optional(320));
  EXPECT_THAT(args->Double("scale"), Optional(0.5));
  EXPECT_THAT(args->Duration("timeout"), Optional(absl::Milliseconds(1500)));
  EXPECT_THAT(args->Bool("tls"), Optional(true));
}

TEST(ArgsTest, ValuesMayLookLikeFlagsOrContainEquals) {
  // "--name value" takes the next word whatever it is: a negative number is
  // a value, not a flag.
  absl::StatusOr<Args> args =
      Parse({"--dim", "-5", "--scale", "-1e3", "--target", "a=b=c"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_THAT(args->Int("dim"), Optional(-5));
  EXPECT_THAT(args->Double("scale"), Optional(-1000.0));
  EXPECT_THAT(args->String("target"), Optional(std::string("a=b=c")));

  // Only the first '=' splits.
  args = Parse({"--target=ipv4:1.2.3.4:5,6.7.8.9:10=x"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_THAT(args->String("target"),
              Optional(std::string("ipv4:1.2.3.4:5,6.7.8.9:10=x")));

  // An empty value is a given flag with an empty string.
  args = Parse({"--target="});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_TRUE(args->Has("target"));
  EXPECT_THAT(args->String("target"), Optional(std::string()));
}

TEST(ArgsTest, TheLastOccurrenceWins) {
  absl::StatusOr<Args> args =
      Parse({"--dim=8", "--dim=16", "--tls", "--notls"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_THAT(args->Int("dim"), Optional(16));
  EXPECT_THAT(args->Bool("tls"), Optional(false));
}

TEST(ArgsTest, BoolForms) {
  struct Case {
    std::vector<std::string> argv;
    bool value;
  };
  const Case cases[] = {
      {{"--tls"}, true},    {{"--notls"}, false},  {{"--tls=true"}, true},
      {{"--tls=1"}, true},  {{"--tls=yes"}, true}, {{"--tls=false"}, false},
      {{"--tls=0"}, false}, {{"--tls=no"}, false}, {{"-tls"}, true},
      {{"-notls"}, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.argv[0]);
    absl::StatusOr<Args> args = Parse(c.argv);
    ASSERT_TRUE(args.ok()) << args.status();
    EXPECT_THAT(args->Bool("tls"), Optional(c.value));
  }
}

TEST(ArgsTest, BadBoolForms) {
  EXPECT_THAT(ErrorOf({"--tls=maybe"}),
              HasSubstr("invalid value 'maybe' for flag --tls"));
  EXPECT_THAT(ErrorOf({"--tls=TRUE"}), HasSubstr("--tls"));
  // A boolean never takes the next word: "false" is a stray argument.
  EXPECT_THAT(ErrorOf({"--tls", "false"}),
              HasSubstr("unexpected argument 'false'"));
  // --no works for booleans only, and takes no value.
  EXPECT_THAT(ErrorOf({"--nodim"}), HasSubstr("unknown flag --nodim"));
  EXPECT_THAT(ErrorOf({"--notls=true"}), HasSubstr("unknown flag --notls"));
}

TEST(ArgsTest, UnknownFlagsAndPositionalArguments) {
  EXPECT_THAT(ErrorOf({"--dims=8"}), HasSubstr("unknown flag --dims"));
  EXPECT_THAT(ErrorOf({"--Dim=8"}), HasSubstr("unknown flag --Dim"));
  EXPECT_THAT(ErrorOf({"--dim=8", "extra"}),
              HasSubstr("unexpected argument 'extra'"));
  EXPECT_THAT(ErrorOf({"-"}), HasSubstr("unexpected argument '-'"));
  EXPECT_THAT(ErrorOf({"--"}), HasSubstr("unexpected argument '--'"));
  EXPECT_THAT(ErrorOf({"--=3"}), HasSubstr("unknown flag --"));
}

TEST(ArgsTest, MissingValue) {
  for (const char* flag : {"--target", "--dim", "--scale", "--timeout"}) {
    SCOPED_TRACE(flag);
    EXPECT_THAT(ErrorOf({"--tls", flag}),
                HasSubstr(std::string("flag ") + flag + " needs a value"));
  }
}

TEST(ArgsTest, MalformedValuesNameTheFlag) {
  struct Case {
    const char* arg;
    const char* message;
  };
  const Case cases[] = {
      {"--dim=abc", "invalid value 'abc' for flag --dim"},
      {"--dim=8.5", "invalid value '8.5' for flag --dim"},
      {"--dim=", "invalid value '' for flag --dim"},
      {"--dim=99999999999999999999", "for flag --dim"},  // beyond int64
      {"--scale=half", "invalid value 'half' for flag --scale"},
      {"--scale=1.5x", "for flag --scale"},
      {"--timeout=5", "invalid value '5' for flag --timeout"},  // no unit
      {"--timeout=fast", "for flag --timeout"},
      {"--timeout=5 s", "for flag --timeout"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.arg);
    EXPECT_THAT(ErrorOf({c.arg}), HasSubstr(c.message));
  }
}

TEST(ArgsTest, NumberEdgeForms) {
  absl::StatusOr<Args> args =
      Parse({"--dim=-9223372036854775808", "--scale=1e-3", "--timeout=0"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_THAT(args->Int("dim"), Optional(INT64_MIN));
  EXPECT_THAT(args->Double("scale"), Optional(1e-3));
  EXPECT_THAT(args->Duration("timeout"), Optional(absl::ZeroDuration()));

  args = Parse({"--timeout=1m30s"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_THAT(args->Duration("timeout"), Optional(absl::Seconds(90)));
}

TEST(ArgsTest, AccessorsOfTheWrongTypeGiveNothing) {
  absl::StatusOr<Args> args = Parse({"--target=abc", "--dim=7"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->Int("target"), std::nullopt);
  EXPECT_EQ(args->Bool("target"), std::nullopt);
  EXPECT_EQ(args->Duration("dim"), std::nullopt);
  // An int flag reads fine as a double or as text.
  EXPECT_THAT(args->Double("dim"), Optional(7.0));
  EXPECT_THAT(args->String("dim"), Optional(std::string("7")));
}

TEST(ArgsTest, FlagHelpListsEveryFlagInOrder) {
  EXPECT_EQ(FlagHelp({{"dim", FlagType::kInt, "width"},
                      {"a_rather_long_flag_name_x", FlagType::kBool, "b"}}),
            "  --dim                    width\n"
            "  --a_rather_long_flag_name_x b\n");
  EXPECT_EQ(FlagHelp({}), "");
}

}  // namespace
}  // namespace temb::cli
