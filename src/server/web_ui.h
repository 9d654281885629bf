// The chat page: GET / (web/index.html) and GET /<file> for the other files of web/, served from the
// copies embedded in the binary (server/web_assets.h). No API key is needed to load the page; the page
// asks for one when the API answers 401.
#pragma once

namespace lilac::server {

class HttpServer;

void add_web_routes(HttpServer& http);

}  // namespace lilac::server
