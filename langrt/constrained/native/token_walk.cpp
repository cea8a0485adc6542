// The tokens a byte automaton can read from one state: a walk of the vocabulary's trie in
// preorder, skipping a node's whole subtree as soon as the automaton dies on its byte. Plain C++
// (no vector instructions), so it builds and runs on any CPU; token_walk.py builds and loads it.
#include <cstddef>
#include <cstdint>
#include <vector>

// The tokens trie node i spells, into `words`: its first token's word and bit (bit 0 where it
// spells none) are precomputed, so the usual zero or one token costs no branch (a branch taken
// at random cost more than the rest of a node's work); duplicate spellings loop.
static inline void mark_tokens(const int32_t* node_word, const uint32_t* node_bit, const int32_t* node_tokens,
                               const int32_t* token_ids, int64_t i, uint32_t* words) {
    words[node_word[i]] |= node_bit[i];
    if (__builtin_expect(node_tokens[i + 1] - node_tokens[i] > 1, 0)) {
        for (int32_t k = node_tokens[i] + 1; k < node_tokens[i + 1]; ++k) {
            words[token_ids[k] >> 5] |= 1u << (token_ids[k] & 31);
        }
    }
}

// The walk over a grammar rule's DFA (cfg/masks.py) also lists where tokens leave the rule: where
// a token, after at least one byte, reaches a byte that may leave it (a call or the rule's end:
// escape bits of the state), the trie node of that byte goes into `escapes` (its whole subtree:
// the pushdown automaton walks it beyond the rule), or past `max_escapes` its subtree's tokens
// into `open` (walked one by one). A regex's DFA passes no escape rows and lists nothing.
// The bytes state s reads back into s (bit b of word b / 32), found on first need during a walk.
static inline const uint32_t* loop_bytes(const int32_t* table, int32_t s, uint32_t* loops, uint8_t* known) {
    uint32_t* bits = loops + static_cast<int64_t>(s) * 8;
    if (!known[s]) {
        known[s] = 1;
        for (int w = 0; w < 8; ++w) bits[w] = 0;
        for (int b = 0; b < 256; ++b) {
            if (table[static_cast<int64_t>(s) * 256 + b] == s) bits[b >> 5] |= 1u << (b & 31);
        }
    }
    return bits;
}

// Whether every byte below node i (subtree_bytes[i]) reads `next` back into itself.
static inline bool stays(const uint32_t* subtree_bytes, int64_t i, const uint32_t* loop) {
    const uint32_t* below = subtree_bytes + i * 8;
    uint32_t outside = 0;
    for (int w = 0; w < 8; ++w) outside |= below[w] & ~loop[w];
    return outside == 0;
}

// A node whose subtree's bytes all loop on its state, where no byte leaves the rule, has every
// token below it readable: they are marked as one range and the subtree is not walked (inside a
// free string, most of the trie).
extern "C" int64_t langrt_token_walk(
    const int32_t* table,          // [states, 256] next state; `dead` where the automaton dies
    int32_t dead,
    int32_t start,
    const int32_t* escape_row,     // per state: its row of escape_bits, or -1; null: no escapes
    const uint32_t* escape_bits,   // [rows, 8]: bit b of row r set when byte b may leave the rule
    const uint8_t* node_byte,      // per trie node, in preorder: the byte on its edge
    const int32_t* node_depth,     // 1 for the root's children
    const int32_t* node_skip,      // the node after its subtree
    const int32_t* node_tokens,    // [nodes + 1] CSR offsets into token_ids: the tokens spelled by the node's path
    const int32_t* token_ids,
    const int32_t* node_word,      // per node: the word of its first token's bit (0 if it spells none)
    const uint32_t* node_bit,      // per node: that bit (0 if it spells none)
    int64_t num_nodes,
    int32_t max_depth,             // of the trie
    int32_t num_states,            // rows of `table`
    uint32_t* words,               // the mask, OR-ed into (bit t % 32 of word t / 32)
    uint32_t* open,
    int32_t* escapes,
    int64_t max_escapes,           // returns the number of escape nodes listed
    const uint32_t* subtree_bytes) { // [nodes, 8]: the bytes on the edges below each node
    // scratch made here, not passed: each array handed over ctypes costs microseconds, more
    // than a structured state's whole walk
    std::vector<int32_t> state_at(static_cast<size_t>(max_depth) + 1);
    std::vector<uint32_t> loop_rows(static_cast<size_t>(num_states) * 8);
    std::vector<uint8_t> loop_known(static_cast<size_t>(num_states), 0);
    int32_t* states = state_at.data();
    uint32_t* loops = loop_rows.data();
    uint8_t* known = loop_known.data();
    states[0] = start;
    int64_t listed = 0, listed_until = 0;
    for (int64_t i = 0; i < num_nodes;) {
        const int32_t depth = node_depth[i];
        const int32_t state = states[depth - 1];
        const uint8_t byte = node_byte[i];
        const int32_t row = escape_row != nullptr && depth >= 2 && i >= listed_until ? escape_row[state] : -1;
        if (row >= 0 && (escape_bits[row * 8 + (byte >> 5)] >> (byte & 31)) & 1u) {
            if (listed < max_escapes) {
                escapes[listed++] = static_cast<int32_t>(i);
            } else {
                for (int32_t k = node_tokens[i]; k < node_tokens[node_skip[i]]; ++k) {
                    open[token_ids[k] >> 5] |= 1u << (token_ids[k] & 31);
                }
            }
            listed_until = node_skip[i];  // nested escapes are in this subtree already
        }
        const int32_t next = table[static_cast<int64_t>(state) * 256 + byte];
        if (__builtin_expect(next == dead, 0)) {
            i = node_skip[i];
            continue;
        }
        if ((escape_row == nullptr || escape_row[next] < 0) && node_skip[i] > i + 1 &&
            stays(subtree_bytes, i, loop_bytes(table, next, loops, known))) {
            for (int32_t k = node_tokens[i]; k < node_tokens[node_skip[i]]; ++k) {
                words[token_ids[k] >> 5] |= 1u << (token_ids[k] & 31);
            }
            i = node_skip[i];
            continue;
        }
        states[depth] = next;
        mark_tokens(node_word, node_bit, node_tokens, token_ids, i, words);
        ++i;
    }
    return listed;
}
