#pragma once
// The status page: GET /status (every job the reader may see, newest first) and GET /status/<job> (one job).
// One self-contained HTML document: inline CSS and script, the timelines drawn as inline SVG by that script, no
// external asset, so that a saved copy works offline. Its data are the read endpoints' (status, jobs, each job's
// history), chosen with the same ReadAccess and embedded in the page as JSON.
//
// Who sees what: a browser cannot make a MUNGE credential, so a page fetched by a browser is anonymous and shows
// what /v1/status shows anyone (job counts by state). `ckpt-controller page [JOB] -o FILE` fetches the page with the
// caller's credential (header X-Ckpt-Credential, payload "GET /status"), as the other client subcommands do: each
// user gets their own jobs, root, SlurmUser and admin_users every job. The file is written mode 0600.
//
// Every text from a job's records is put in the page by the script as text (never as markup), the embedded JSON
// has '<', '>' and '&' escaped, and a Content-Security-Policy lets only the page's own nonce-tagged script and
// style run.
#include <cstdint>
#include <optional>
#include <string>

#include "ckpt/controller_limits.hpp"

namespace ckpt::controller {

class Engine;

// Renders the page as `access` may see it at `now`; with `job`, that job alone (nullopt when it is not tracked or
// not visible to `access`). Lists at most 200 jobs and draws the timelines of the 20 most recently updated.
std::optional<std::string> render_status_page(Engine& engine, const ckpt::recovery::ReadAccess& access, double now,
                                              std::optional<std::uint32_t> job);

// The HTTP headers sent with the page: it may show private jobs (never cached), and it is never framed or sniffed.
inline constexpr const char* kStatusPageHeaders =
    "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nX-Frame-Options: DENY\r\n"
    "Referrer-Policy: no-referrer\r\n";

}  // namespace ckpt::controller
