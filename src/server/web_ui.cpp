#include "server/web_ui.h"

#include <httplib.h>

#include "server/http_server.h"

#include <string>

#include "server/web_assets.h"

namespace lilac::server {

void add_web_routes(HttpServer& http) {
  for (const WebAsset& a : web_assets()) {
    const std::string path = a.path;
    auto serve = [&a](const httplib::Request&, httplib::Response& res) {
      res.set_content(reinterpret_cast<const char*>(a.data), a.size, a.content_type);
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Content-Type-Options", "nosniff");
      res.set_header("Content-Security-Policy",
                     "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'");
    };
    http.Get(path, serve);
    if (path == "/index.html") http.Get("/", serve);
  }
}

}  // namespace lilac::server
