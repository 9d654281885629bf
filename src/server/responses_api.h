// The OpenAI Responses adapter: POST /v1/responses, stateless (through the shared endpoint path,
// server/endpoint.h: route hook, generation core, the Responses formatter). Errors in OpenAI's shape.
#pragma once

namespace lilac::server {

class HttpServer;

struct ServerContext;

void add_responses_routes(HttpServer& http, ServerContext& ctx);

}  // namespace lilac::server
