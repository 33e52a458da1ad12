// Client text inside error messages: escaped and cut short.
#include "temb/base/quoted.h"

#include <string>

#include "gtest/gtest.h"

namespace temb {
namespace {

TEST(QuotedTest, ShortTextIsQuotedAndEscaped) {
  EXPECT_EQ(Quoted("sd15"), "\"sd15\"");
  EXPECT_EQ(Quoted("a\"b\nc\x1b[31m"), "\"a\\\"b\\nc\\x1b[31m\"");
  EXPECT_EQ(Quoted(""), "\"\"");
}

TEST(QuotedTest, LongTextIsElidedWithItsLength) {
  const std::string name(12000, 'x');
  const std::string quoted = Quoted(name);
  EXPECT_EQ(quoted,
            "\"" + std::string(kQuotedMaxBytes, 'x') + "...\" (12000 bytes)");
  EXPECT_LT(quoted.size(), 100u);
}

}  // namespace
}  // namespace temb
