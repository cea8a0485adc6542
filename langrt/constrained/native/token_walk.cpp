// The tokens a byte automaton can read from one state: a depth-first walk of the vocabulary's
// trie, skipping a child's whole subtree as soon as the automaton dies on its byte. Plain C++
// (no vector instructions), so it builds and runs on any CPU; token_walk.py builds and loads it.
//
// Laid out for a cold cache (a mask is computed after a model's forward pass has evicted the
// trie): a node's children are listed together as (node, byte) words, so a child the automaton
// dies on costs a 4-byte read beside its siblings and its node is never touched; a live node's
// fields all sit in one 64-byte line.
#include <cstddef>
#include <cstdint>
#include <vector>

struct alignas(64) Node {
    uint32_t below[8];     // the bytes on the edges below the node (bit b of word b / 32)
    int32_t word;          // the word of its first token's bit (0 where it spells none)
    uint32_t bit;          // that bit (0 where it spells none)
    int32_t skip;          // the first node (preorder) after its subtree
    int32_t tokens;        // offset into token_ids of the tokens it spells
    int32_t own_end;       // ... the end of those
    int32_t tokens_end;    // ... and of those of its whole subtree
    int32_t children;      // offset into `children` of its children's entries
    uint16_t num_children;
    uint16_t unused;
};
static_assert(sizeof(Node) == 64, "one cache line per node");

struct Trie {
    const Node* nodes;
    const uint32_t* children;  // per parent, its children as (node << 8 | byte), in byte order
    const int32_t* token_ids;  // the tokens spelled, node after node (preorder)
    int32_t num_root_children;
    int32_t root_children;     // offset into `children` of the root's
    int32_t max_depth;
};

// One walk's outputs and scratch, owned by the caller (one per thread).
struct Output {
    uint32_t* words;    // the mask, OR-ed into (bit t % 32 of word t / 32)
    uint32_t* open;     // tokens of escape subtrees past max_escapes
    int32_t* escapes;   // escape nodes, ascending
    int32_t* escape_states;  // per escape node, the state before its byte
    int64_t max_escapes;
};

static inline void mark(uint32_t* words, int32_t token) { words[token >> 5] |= 1u << (token & 31); }

static inline void mark_range(uint32_t* words, const int32_t* token_ids, int32_t from, int32_t to) {
    for (int32_t k = from; k < to; ++k) mark(words, token_ids[k]);
}

// The bytes state s reads back into s, found on first need during a walk: rows kept per thread,
// stamped with the walk that filled them, so a walk over a big automaton clears nothing.
struct LoopRows {
    std::vector<uint32_t> bits;
    std::vector<uint32_t> stamp;
    uint32_t walk = 0;

    void start(int32_t num_states) {
        if (stamp.size() < static_cast<size_t>(num_states)) {
            stamp.assign(static_cast<size_t>(num_states), 0);
            bits.resize(static_cast<size_t>(num_states) * 8);
        }
        if (++walk == 0) {  // the stamps wrapped: clear them once
            stamp.assign(stamp.size(), 0);
            walk = 1;
        }
    }

    const uint32_t* of(const int32_t* table, int32_t s) {
        uint32_t* row = bits.data() + static_cast<int64_t>(s) * 8;
        if (stamp[s] != walk) {
            stamp[s] = walk;
            for (int w = 0; w < 8; ++w) row[w] = 0;
            const int32_t* next = table + static_cast<int64_t>(s) * 256;
            for (int b = 0; b < 256; ++b) row[b >> 5] |= static_cast<uint32_t>(next[b] == s) << (b & 31);
        }
        return row;
    }
};

static thread_local LoopRows loop_rows;
static thread_local std::vector<int64_t> frames;  // the walk's stack: 3 words a level

// Whether every byte below `node` reads `loop`'s state back into itself.
static inline bool stays(const Node& node, const uint32_t* loop) {
    uint32_t outside = 0;
    for (int w = 0; w < 8; ++w) outside |= node.below[w] & ~loop[w];
    return outside == 0;
}

// The walk over a grammar rule's DFA (cfg/masks.py) also lists where tokens leave the rule: where
// a token, after at least one byte, reaches a byte that may leave it (a call or the rule's end:
// escape bits of the state), the trie node of that byte goes into `escapes` (its whole subtree:
// the pushdown automaton walks it beyond the rule), or past `max_escapes` its subtree's tokens
// into `open` (walked one by one). A regex's DFA passes no escape rows and lists nothing.
// A node whose subtree's bytes all loop on its state, where no byte leaves the rule, has every
// token below it readable: they are marked as one range and the subtree is not walked (inside a
// free string, most of the trie). Below a node, the walk reads the bytes after it, as the root's
// walk reads a token's first: no escape is listed at the first. Returns the escape nodes listed,
// plus 2^32 if `open` was set.
extern "C" int64_t langrt_token_walk(
    const Trie* trie,
    const int32_t* table,          // [states, 256] next state; `dead` where the automaton dies
    int32_t dead,
    int32_t num_states,            // rows of `table`
    int32_t start,
    const int32_t* escape_row,     // per state: its row of escape_bits, or -1; null: no escapes
    const uint32_t* escape_bits,   // [rows, 8]: bit b of row r set when byte b may leave the rule
    int32_t below,                 // -1: every token; a node: the tokens below it, `start` after its byte
    const Output* out) {
    const Node* nodes = trie->nodes;
    const uint32_t* children = trie->children;
    const int32_t* token_ids = trie->token_ids;
    loop_rows.start(num_states);
    frames.resize(static_cast<size_t>(trie->max_depth + 1) * 3);
    int64_t* stack = frames.data();
    int64_t listed = 0, listed_until = 0, opened = 0;
    // a frame: the next child entry, the end of its siblings', the state before their byte
    int depth = 0;
    stack[0] = below < 0 ? trie->root_children : nodes[below].children;
    stack[1] = below < 0 ? trie->root_children + trie->num_root_children : stack[0] + nodes[below].num_children;
    stack[2] = start;
    while (depth >= 0) {
        int64_t* frame = stack + depth * 3;
        if (frame[0] == frame[1]) {
            --depth;
            continue;
        }
        const uint32_t entry = children[frame[0]++];
        const int32_t i = static_cast<int32_t>(entry >> 8);
        const uint32_t byte = entry & 0xff;
        const int32_t state = static_cast<int32_t>(frame[2]);
        if (escape_row != nullptr && depth >= 1 && i >= listed_until) {
            const int32_t row = escape_row[state];
            if (row >= 0 && (escape_bits[row * 8 + (byte >> 5)] >> (byte & 31)) & 1u) {
                const Node& node = nodes[i];
                if (listed < out->max_escapes) {
                    out->escapes[listed] = i;
                    out->escape_states[listed++] = state;
                } else {
                    mark_range(out->open, token_ids, node.tokens, node.tokens_end);
                    opened = 1;
                }
                listed_until = node.skip;  // nested escapes are in this subtree already
            }
        }
        const int32_t next = table[static_cast<int64_t>(state) * 256 + byte];
        if (__builtin_expect(next == dead, 0)) continue;
        const Node& node = nodes[i];
        if (node.num_children != 0 && (escape_row == nullptr || escape_row[next] < 0) &&
            stays(node, loop_rows.of(table, next))) {
            mark_range(out->words, token_ids, node.tokens, node.tokens_end);
            continue;
        }
        // the usual zero or one token costs no branch (bit 0 where none)
        out->words[node.word] |= node.bit;
        if (__builtin_expect(node.own_end - node.tokens > 1, 0)) mark_range(out->words, token_ids, node.tokens + 1, node.own_end);
        if (node.num_children != 0) {
            int64_t* below = stack + (++depth) * 3;
            below[0] = node.children;
            below[1] = node.children + node.num_children;
            below[2] = next;
        }
    }
    return listed | (opened << 32);
}
