// The OpenAI adapters: POST /v1/chat/completions and /v1/completions (request -> GenerationSpec, then
// the generation core and the OpenAI formatters), GET /v1/models. The route hook (hybrid router) sees
// the generation requests first.
#pragma once
#include <nlohmann/json.hpp>

#include "server/generation.h"

namespace lilac::server {

class HttpServer;
struct ServerContext;

void add_openai_routes(HttpServer& http, ServerContext& ctx);

// The prompt side of the GenerationSpec a /v1/chat/completions body makes (validated as that endpoint does: ApiError
// naming the field): what GenerationCore::prompt_ids renders.
GenerationSpec openai_chat_spec(ServerContext& ctx, const nlohmann::ordered_json& body);

}  // namespace lilac::server
