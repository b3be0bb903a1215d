// Parsers and printers of planner quantities, and the text table.
#include "plan/units.h"

#include <gtest/gtest.h>

#include "plan/table.h"

namespace atl::plan {
namespace {

TEST(Units, ParseCount) {
  EXPECT_DOUBLE_EQ(*ParseCount("100T"), 1e14);
  EXPECT_DOUBLE_EQ(*ParseCount("1.5B"), 1.5e9);
  EXPECT_DOUBLE_EQ(*ParseCount("16k"), 16e3);
  EXPECT_DOUBLE_EQ(*ParseCount("7e9"), 7e9);
  EXPECT_DOUBLE_EQ(*ParseCount(" 2P "), 2e15);
  EXPECT_EQ(ParseCount("12Q").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseCount("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseCount("T").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseCount("-5").status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ParseCount("12Q").status().message().find("12Q"), std::string::npos);
}

TEST(Units, ParseBitsPerSecond) {
  EXPECT_DOUBLE_EQ(*ParseBitsPerSecond("400Gbps"), 400e9);
  EXPECT_DOUBLE_EQ(*ParseBitsPerSecond("400Gb/s"), 400e9);
  EXPECT_DOUBLE_EQ(*ParseBitsPerSecond("50GB/s"), 400e9);
  EXPECT_DOUBLE_EQ(*ParseBitsPerSecond("1.6Tbps"), 1.6e12);
  EXPECT_DOUBLE_EQ(*ParseBitsPerSecond("1e9"), 1e9);
  EXPECT_FALSE(ParseBitsPerSecond("4Gbits").ok());
  EXPECT_FALSE(ParseBitsPerSecond("fast").ok());
}

TEST(Units, ParseSeconds) {
  EXPECT_DOUBLE_EQ(*ParseSeconds("20ms"), 0.02);
  EXPECT_DOUBLE_EQ(*ParseSeconds("1.5us"), 1.5e-6);
  EXPECT_DOUBLE_EQ(*ParseSeconds("30s"), 30);
  EXPECT_DOUBLE_EQ(*ParseSeconds("30min"), 1800);
  EXPECT_DOUBLE_EQ(*ParseSeconds("2h"), 7200);
  EXPECT_DOUBLE_EQ(*ParseSeconds("3d"), 259200);
  EXPECT_DOUBLE_EQ(*ParseSeconds("0.25"), 0.25);
  EXPECT_FALSE(ParseSeconds("5 parsecs").ok());
}

TEST(Units, Format) {
  EXPECT_EQ(FormatSci(1.234e28), "1.23e28");
  EXPECT_EQ(FormatSci(9.996e27), "1.00e28");
  EXPECT_EQ(FormatSci(0), "0");
  EXPECT_EQ(FormatCount(1536), "1.54k");
  EXPECT_EQ(FormatCount(3.2e14), "320T");
  EXPECT_EQ(FormatCount(12), "12");
  EXPECT_EQ(FormatBytes(1.2e12), "1.20 TB");
  EXPECT_EQ(FormatSeconds(4.5e-6), "4.5 us");
  EXPECT_EQ(FormatSeconds(0.012), "12.0 ms");
  EXPECT_EQ(FormatSeconds(3.25), "3.25 s");
  EXPECT_EQ(FormatBitsPerSecond(4e11), "400 Gbps");
}

TEST(TextTable, AlignsColumns) {
  TextTable t;
  t.AddColumn("name", TextTable::Align::kLeft);
  t.AddColumn("value");
  t.AddRow({"a", "1"});
  t.AddRow({"longer", "12345"});
  EXPECT_EQ(t.Render(),
            "name    value\n"
            "-------------\n"
            "a           1\n"
            "longer  12345\n");
}

}  // namespace
}  // namespace atl::plan
