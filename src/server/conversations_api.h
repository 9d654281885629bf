// OpenAI's Conversations API over the conversation store (server/conversation_store.h), in the shapes the `openai`
// client's `conversations` resource reads:
//   POST   /v1/conversations                         {items?: [<= 20 items], metadata?} -> the conversation
//   GET    /v1/conversations/{id}                    -> {"id", "object": "conversation", "created_at", "metadata"}
//   POST   /v1/conversations/{id}                    {metadata} -> the conversation, its metadata replaced
//   DELETE /v1/conversations/{id}                    -> {"id", "object": "conversation.deleted", "deleted": true}
//   GET    /v1/conversations/{id}/items              ?order=desc|asc&limit=1..100 (20)&after=ITEM_ID -> a list page
//   POST   /v1/conversations/{id}/items              {items: [<= 20 items]} -> the list of the items added
//   GET    /v1/conversations/{id}/items/{item_id}    -> the item
//   DELETE /v1/conversations/{id}/items/{item_id}    -> the conversation
// Items are what a Responses input takes (messages, function_call, function_call_output, reasoning), stored with an
// id each. A Responses request with `conversation` reads them as the turns before its input, and once it completes
// its input items and output are added. Metadata: at most 16 string pairs (keys <= 64 characters, values <= 512).
// Errors are OpenAI's shape: 404 for an id not held here, 400 naming the field.
#pragma once

namespace lilac::server {

class HttpServer;
struct ServerContext;

void add_conversations_routes(HttpServer& http, ServerContext& ctx);

}  // namespace lilac::server
