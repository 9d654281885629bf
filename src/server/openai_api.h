// The OpenAI adapters: POST /v1/chat/completions and /v1/completions (request -> GenerationSpec, then
// the generation core and the OpenAI formatters), GET /v1/models. The route hook (hybrid router) sees
// the generation requests first.
#pragma once

namespace lilac::server {

class HttpServer;
struct ServerContext;

void add_openai_routes(HttpServer& http, ServerContext& ctx);

}  // namespace lilac::server
