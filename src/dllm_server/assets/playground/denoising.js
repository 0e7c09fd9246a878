// The history of one request's denoising, as the progress chunks told it: every forward's block,
// step and committed positions (with their tokens). Nothing here touches the page, so any step of
// the history can be shown again (replay).

export function answerLength(maxTokens, blockLength) {
  return Math.ceil(maxTokens / blockLength) * blockLength;   // the server rounds up to whole blocks
}

export class Denoising {
  // blockOffset: prompt positions inside the first answer block (block-causal models such as SDAR,
  // whose blocks lie on the grid from position 0; 0 for LLaDA / Dream)
  constructor({answerLen, blockLength, maxTokens, stopIds, blockOffset = 0}) {
    this.answerLen = answerLen;
    this.blockLength = blockLength;
    this.blockOffset = blockOffset;
    this.maxTokens = maxTokens;
    this.numBlocks = Math.ceil((answerLen + blockOffset) / blockLength);
    this.stopIds = new Set(stopIds || []);
    this.forwards = [];                                    // {block, step, positions, masked}
    this.committedAt = new Int32Array(answerLen);          // forward (1-based) that committed a cell; 0: never
    this.tokenId = new Int32Array(answerLen).fill(-1);
    this.tokenText = new Array(answerLen).fill("");
    this.rewrites = new Map();                             // token editing: cell -> [{f, from, id, text}], in order
  }

  // One progress chunk's `dllm` field: one forward of this request. Under token editing a cell
  // filled earlier may be rewritten (d.edits: [position, from id, to id]); its history is kept.
  add(d) {
    const f = this.forwards.length + 1;
    const edited = new Set((d.edits || []).map(e => e[0]));
    d.positions.forEach((p, i) => {
      if (p < 0 || p >= this.answerLen) return;
      const id = d.token_ids ? d.token_ids[i] : -1, text = d.tokens ? d.tokens[i] : "";
      if (edited.has(p) && this.committedAt[p] > 0) {
        if (!this.rewrites.has(p)) this.rewrites.set(p, []);
        this.rewrites.get(p).push({f, from: this.tokenId[p], fromText: this.tokenText[p], id, text});
        return;
      }
      this.committedAt[p] = f;
      this.tokenId[p] = id;
      this.tokenText[p] = text;
    });
    this.forwards.push({block: d.block, step: d.step, positions: d.positions, masked: d.masked,
                        edits: edited.size});
  }

  // What cell p holds after k forwards: {id, text, edits (rewrites so far), editedAt (forward of the last)}.
  tokenAt(p, k) {
    let id = this.tokenId[p], text = this.tokenText[p], edits = 0, editedAt = 0;
    for (const r of this.rewrites.get(p) || []) {
      if (r.f > k) break;
      ({id, text} = r);
      edits += 1;
      editedAt = r.f;
    }
    return {id, text, edits, editedAt};
  }

  get length() {
    return this.forwards.length;
  }

  // Masked cells after k forwards (k = 0: the untouched canvas), as the server counted them.
  maskedAfter(k) {
    return k === 0 ? this.answerLen : this.forwards[k - 1].masked;
  }

  // The block being denoised after k forwards.
  blockAfter(k) {
    return k === 0 ? 0 : this.forwards[k - 1].block;
  }

  blockOf(position) {
    return Math.floor((position + this.blockOffset) / this.blockLength);
  }

  // Answer positions of block b: [first, end).
  blockRange(b) {
    const start = b * this.blockLength - this.blockOffset;
    return [Math.max(0, start), Math.min(start + this.blockLength, this.answerLen)];
  }

  // Forwards each block has taken within the first k forwards.
  stepsPerBlock(k) {
    const steps = new Array(this.numBlocks).fill(0);
    for (let i = 0; i < k; i++) steps[this.forwards[i].block] += 1;
    return steps;
  }

  isStop(position, k = this.forwards.length) {
    return this.stopIds.has(this.tokenAt(position, k).id);
  }
}

// What a committed cell shows for its token: a visible sign for blanks, a placeholder for a
// byte that is only part of a multi-byte character (the answer text has the whole character).
export function cellText(text, isStop) {
  if (isStop) return {text: "∎", kind: "eos"};
  if (text === " ") return {text: "␣", kind: "blank"};
  if (text === "\n") return {text: "↵", kind: "blank"};
  if (text === "\t") return {text: "⇥", kind: "blank"};
  if (text.includes("\ufffd")) return {text: "·", kind: "partial"};
  if (text === "") return {text: "◇", kind: "blank"};
  return {text: text.replace(/\s/g, "␣"), kind: "token"};
}
