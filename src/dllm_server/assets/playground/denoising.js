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
  }

  // One progress chunk's `dllm` field: one forward of this request.
  add(d) {
    const f = this.forwards.length + 1;
    d.positions.forEach((p, i) => {
      if (p < 0 || p >= this.answerLen) return;
      this.committedAt[p] = f;
      this.tokenId[p] = d.token_ids ? d.token_ids[i] : -1;
      this.tokenText[p] = d.tokens ? d.tokens[i] : "";
    });
    this.forwards.push({block: d.block, step: d.step, positions: d.positions, masked: d.masked});
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

  isStop(position) {
    return this.stopIds.has(this.tokenId[position]);
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
