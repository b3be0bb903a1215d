// A plain-text table for terminal reports: columns sized to their widest cell, numbers
// right-aligned, text left-aligned, a rule under the header.
//
// Thread-safety: a value; not safe for concurrent mutation.
#pragma once

#include <string>
#include <vector>

namespace atl::plan {

class TextTable {
 public:
  enum class Align { kLeft, kRight };

  // Adds a column; call before any AddRow.
  void AddColumn(std::string header, Align align = Align::kRight);
  // REQUIRES: cells.size() == number of columns.
  void AddRow(std::vector<std::string> cells);
  // The table with a trailing newline; an empty string when there are no columns.
  std::string Render() const;

 private:
  std::vector<std::string> headers_;
  std::vector<Align> aligns_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace atl::plan
