// Anthropic's Message Batches (the `@anthropic-ai/sdk` client's `messages.batches`): a batch of Messages requests
// answered asynchronously, run on the generation core a few at a time beside the interactive traffic (continuous
// batching makes them cheap), its results kept in this process's memory.
//   POST   /v1/messages/batches                {requests: [{custom_id, params: a Messages request}], <= 10,000}
//   GET    /v1/messages/batches[?limit&after_id]  newest first
//   GET    /v1/messages/batches/{id}           the batch: processing_status in_progress / canceling / ended,
//                                              request_counts, results_url once ended
//   POST   /v1/messages/batches/{id}/cancel    the requests not yet ended become `canceled`
//   GET    /v1/messages/batches/{id}/results   JSON lines {custom_id, result: succeeded {message} | errored {error}
//                                              | canceled}, in request order (400 before it ended)
//   DELETE /v1/messages/batches/{id}           an ended batch -> {"id", "type": "message_batch_deleted"}
// A request's params are checked when it runs (as Anthropic's API does): one it refuses is an `errored` result with
// the error /v1/messages would answer. Errors of the routes themselves are Anthropic's shape. At most kMaxBatches
// batches are held (the oldest ended dropped first); a new one beyond that while all run is 429. Their memory is
// bounded too (ServerOptions::batches_bytes, --batches-mb): the requests of running batches (as JSON text) and every
// result line kept, counted by size. A batch larger than all of it is 413 request_too_large; one that does not fit
// beside the running batches' requests is 429 rate_limit_error; the results of ended batches make room (the batch that
// ended first loses its results first: archived_at set, its results 404 "expired"), and a result that still does not
// fit is an errored result (request_too_large) saying so.
#pragma once

namespace lilac::server {

class HttpServer;
struct ServerContext;

void add_message_batch_routes(HttpServer& http, ServerContext& ctx);

}  // namespace lilac::server
