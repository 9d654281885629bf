// The OpenAI Responses adapter: POST /v1/responses (through the shared endpoint path, server/endpoint.h:
// route hook, generation core, the Responses formatter) and the stored responses' GET /v1/responses/{id},
// GET /v1/responses/{id}/input_items and DELETE /v1/responses/{id} (server/response_store.h). Errors in
// OpenAI's shape.
#pragma once

namespace lilac::server {

class HttpServer;

struct ServerContext;

void add_responses_routes(HttpServer& http, ServerContext& ctx);

}  // namespace lilac::server
