// The Anthropic Messages adapter: POST /v1/messages (through the shared endpoint path,
// server/endpoint.h: route hook, generation core, the Messages formatter) and POST
// /v1/messages/count_tokens (the prompt rendered and tokenized as /v1/messages would, nothing
// generated). Every error on these routes is in Anthropic's shape; the `anthropic-version` header,
// when given, must be a version date from 2023-01-01 on (answers have the 2023-06-01 shape).
#pragma once

#include "server/endpoint.h"
#include "server/http_server.h"

namespace lilac::server {

class HttpServer;
struct ServerContext;

void add_anthropic_routes(HttpServer& http, ServerContext& ctx);
// An ApiError in Anthropic's shape; the route options that give the HTTP layer's own errors on a route (401, 413, 408,
// 503 ...) that shape too.
void send_anthropic_error(httplib::Response& res, const ApiError& e);
RouteOptions anthropic_route_options();
// The status Anthropic's API answers when it is overloaded (overloaded_error): a request refused because too many
// bodies are being parsed at once (server/parse_budget.h) gets it on these routes.
inline constexpr int kAnthropicOverloaded = 529;
// POST /v1/messages's endpoint (its request translation and formatter; the Message Batches run requests with it).
Endpoint messages_endpoint(ServerContext& C);

}  // namespace lilac::server
