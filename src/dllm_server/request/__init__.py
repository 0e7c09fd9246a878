"""One request's I/O on the front: input checks, tokenizer, RequestState, its output events and detokenizing."""
