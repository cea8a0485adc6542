// The tokens a byte automaton can read from one state: a walk of the vocabulary's trie in
// preorder, skipping a node's whole subtree as soon as the automaton dies on its byte. Plain C++
// (no vector instructions), so it builds and runs on any CPU; token_walk.py builds and loads it.
#include <cstdint>

extern "C" int64_t langrt_token_walk(
    const int32_t* table,          // [states, 256] next state; `dead` where the automaton dies
    int32_t dead,
    int32_t start,
    const uint8_t* node_byte,      // per trie node, in preorder: the byte on its edge
    const int32_t* node_depth,     // 1 for the root's children
    const int32_t* node_skip,      // the node after its subtree
    const int32_t* node_tokens,    // [nodes + 1] CSR offsets into token_ids: the tokens spelled by the node's path
    const int32_t* token_ids,
    int64_t num_nodes,
    int32_t* states,               // scratch: [max depth + 1]
    uint32_t* words) {             // the mask, OR-ed into (bit t % 32 of word t / 32)
    states[0] = start;
    int64_t visited = 0;
    for (int64_t i = 0; i < num_nodes;) {
        const int32_t depth = node_depth[i];
        const int32_t next = table[static_cast<int64_t>(states[depth - 1]) * 256 + node_byte[i]];
        ++visited;
        if (next == dead) {
            i = node_skip[i];
            continue;
        }
        states[depth] = next;
        for (int32_t k = node_tokens[i]; k < node_tokens[i + 1]; ++k) {
            const int32_t t = token_ids[k];
            words[t >> 5] |= 1u << (t & 31);
        }
        ++i;
    }
    return visited;
}
