#pragma once
// The plugstack.conf keys that are site policy only; each option's `key` in option_specs() (ckpt/options.hpp)
// sets the site default for that option. parse_site_policy knows exactly these keys and the options' keys;
// spank_ckpt(8) is generated from both tables.
#include <array>

namespace ckpt {

struct SiteKeySpec {
  const char* key;      // "min_interval"
  const char* arginfo;  // what the value looks like: "DURATION"
  const char* usage;    // what it does, for spank_ckpt(8)
  const char* example;  // a value parse_site_policy accepts (tests check that it does)
};

// The table, in the order spank_ckpt(8) lists it.
const std::array<SiteKeySpec, 9>& site_key_specs();

}  // namespace ckpt
