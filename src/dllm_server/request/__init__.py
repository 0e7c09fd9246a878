"""One request's I/O on the front side: input checks, tokenizer and chat template, the host canvas
(RequestState), how worker messages advance it, incremental detokenization and its event stream."""
