// The chat page's files (web/ in the source tree), embedded in the binary at build time by
// cmake/embed_web.cmake (the generated web_assets.cpp defines web_assets()).
#pragma once
#include <cstddef>
#include <vector>

namespace lilac::server {

struct WebAsset {
  const char* path;          // URL path, e.g. "/app.js"
  const char* content_type;  // e.g. "text/javascript; charset=utf-8"
  const unsigned char* data;
  size_t size;
};

const std::vector<WebAsset>& web_assets();

}  // namespace lilac::server
