// The OpenAI adapters: POST /v1/chat/completions and /v1/completions (request -> GenerationSpec, then
// the generation core and the OpenAI formatters), GET /v1/models. The route hook (hybrid router) sees
// the generation requests first.
#pragma once

namespace httplib {
class Server;
}

namespace lilac::server {

struct ServerContext;

void add_openai_routes(httplib::Server& http, ServerContext& ctx);

}  // namespace lilac::server
