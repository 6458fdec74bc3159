#pragma once
// A small roff (man macro) writer for the generated man pages: escaping and the few macros the pages use.
#include <string>
#include <string_view>

namespace ckpt::man {

// Text for a roff body line: backslashes escaped, a leading '.' or '\'' kept literal.
std::string roff_text(std::string_view text);
// An option, command or key name: as roff_text, with every '-' a real hyphen-minus (\-) so it can be copied.
std::string roff_name(std::string_view text);

class Page {
 public:
  // .TH NAME SECTION DATE SOURCE MANUAL
  Page(std::string_view name, int section, std::string_view version);
  void section(std::string_view title);               // .SH
  void subsection(std::string_view title);            // .SS
  void paragraph(std::string_view text);              // .PP and the text
  void text(std::string_view text);                   // the text, in the current paragraph
  void raw(std::string_view line);                    // a line as is (already roff)
  // .TP: a tagged paragraph; `tag` is roff already (use bold(), italic()).
  void item(std::string_view tag, std::string_view text);
  void example(std::string_view lines);               // .nf/.fi block, indented
  const std::string& str() const { return out_; }

 private:
  std::string out_;
};

std::string bold(std::string_view name);     // \fBname\fR, name escaped by roff_name
std::string italic(std::string_view text);   // \fItext\fR, escaped by roff_text

}  // namespace ckpt::man
