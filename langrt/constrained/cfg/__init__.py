"""langrt's context-free grammar engine: grammars (EBNF text, or trees built by the JSON-schema
compiler) as a pushdown automaton over bytes whose rules are regex DFAs, with token masks per
configuration.

Modules: ast.py (grammar trees), ebnf.py (GBNF/EBNF text -> trees), rules.py (trees -> rule
regexes with call markers; left recursion refused), pda.py (the automaton, determinised lazily),
masks.py (token masks per configuration), build.py (rules -> automaton)."""
