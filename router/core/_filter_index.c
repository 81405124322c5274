/* router.core._filter_index: the compiled filter index behind the subscription trie.
 *
 * The same contract as router.core.filter_index.PureFilterIndex (read its docstring
 * first): a map from plain topic filters to terminal objects that answers "which
 * terminals' filters match this topic name" with one walk over C structures.
 *
 * Layout. Filters without wildcards live in one hash table keyed by the whole filter.
 * Filters with a wildcard live in a trie with one Node per level: literal children in an
 * open-addressing table keyed by the level's bytes, and the '+' and '#' children in their
 * own slots. A key is the UTF-8 bytes of the level (or of the whole exact filter); its
 * hash is CPython's bytes hash (SipHash with the process's random key), so a client that
 * chooses topic levels cannot flood a table with collisions.
 *
 * A match hashes every level of the topic once, looks the whole topic up in the exact
 * table, and walks the trie depth first with an explicit stack: no recursion, no Python
 * object per level, no allocation for topics of up to STACK_LEVELS levels.
 *
 * Memory comes from PyMem_Malloc, so tracemalloc counts it. The index holds a strong
 * reference to each terminal; it does not take part in cyclic garbage collection, so a
 * terminal must not refer back to its index.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

#define STACK_LEVELS 32
#define MIN_CAPACITY 2

typedef struct Node Node;

typedef struct {
    Py_hash_t hash;
    Node *node;
} Slot;

/* A table of nodes by key: open addressing, linear probing, backward-shift deletion.
 * capacity is 0 (no slots) or a power of two; count * 3 < capacity * 2 holds. */
typedef struct {
    Slot *slots;
    uint32_t capacity;
    uint32_t count;
} Table;

struct Node {
    Node *plus;          /* the '+' child */
    Node *hash;          /* the '#' child */
    Table children;      /* literal children by level */
    PyObject *terminal;  /* the filter ending here (strong), or NULL */
    Py_ssize_t length;   /* of key */
    char key[];          /* the level's bytes (a trie node) or the whole filter (exact) */
};

typedef struct {
    PyObject_HEAD
    Node *root;          /* never NULL; holds no key */
    Table exact;         /* exact filters: key is the whole filter */
    Py_ssize_t size;     /* filters with a terminal */
    Py_ssize_t nodes;    /* trie nodes besides the root */
} FilterIndex;

static Py_hash_t
hash_bytes(const char *data, Py_ssize_t length)
{
#if PY_VERSION_HEX >= 0x030E0000
    return Py_HashBuffer(data, length);
#else
    return _Py_HashBytes(data, length);
#endif
}

/* -- terminals ---------------------------------------------------------------------- */

/* Who subscribed to one filter: the trie's terminal, readable here without an attribute
 * lookup. It takes no part in cyclic garbage collection: it must hold no cycle. */
typedef struct {
    PyObject_HEAD
    PyObject *filter;
    PyObject *subs;
    PyObject *groups;
} Terminal;

static PyMemberDef Terminal_members[] = {
    {"filter", T_OBJECT, offsetof(Terminal, filter), READONLY, "the plain filter"},
    {"subs", T_OBJECT, offsetof(Terminal, subs), 0, "client id -> options, or None"},
    {"groups", T_OBJECT, offsetof(Terminal, groups), 0, "shared filter -> group, or None"},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *
Terminal_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *filter;
    if ((kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)
        || !PyArg_UnpackTuple(args, "Terminal", 1, 1, &filter)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "Terminal() takes one positional argument");
        }
        return NULL;
    }
    Terminal *self = (Terminal *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->filter = Py_NewRef(filter);
    self->subs = Py_NewRef(Py_None);
    self->groups = Py_NewRef(Py_None);
    return (PyObject *)self;
}

static void
Terminal_dealloc(Terminal *self)
{
    Py_XDECREF(self->filter);
    Py_XDECREF(self->subs);
    Py_XDECREF(self->groups);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject TerminalType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "router.core._filter_index.Terminal",
    .tp_doc = "Terminal(filter): who subscribed to one plain filter (subs, groups).",
    .tp_basicsize = sizeof(Terminal),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Terminal_new,
    .tp_dealloc = (destructor)Terminal_dealloc,
    .tp_members = Terminal_members,
};

/* -- nodes and tables --------------------------------------------------------------- */

static Node *
node_new(const char *key, Py_ssize_t length)
{
    Node *node = PyMem_Malloc(sizeof(Node) + (size_t)length);
    if (node == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    node->plus = NULL;
    node->hash = NULL;
    node->children.slots = NULL;
    node->children.capacity = 0;
    node->children.count = 0;
    node->terminal = NULL;
    node->length = length;
    if (length) {
        memcpy(node->key, key, (size_t)length);
    }
    return node;
}

static int
node_is_empty(const Node *node)
{
    return node->terminal == NULL && node->plus == NULL && node->hash == NULL
           && node->children.count == 0;
}

/* Put a subtree in front of the pending list of node_free_tree: its chain of '+'
 * children is a list through `plus` already, so its last node links to the rest. */
static void
pending_push(Node **pending, Node *subtree)
{
    if (subtree == NULL) {
        return;
    }
    Node *last = subtree;
    while (last->plus != NULL) {
        last = last->plus;
    }
    last->plus = *pending;
    *pending = subtree;
}

/* Free a node and everything below it, releasing the terminals. No recursion and no
 * allocation (so it cannot fail, and a filter of 32,767 levels needs no deep C stack):
 * the nodes still to free form one list linked through `plus`, where a node's own '+'
 * child, when it has one, is the next in the list. Each node is walked over at most
 * twice: linear in the nodes. */
static void
node_free_tree(Node *node)
{
    Node *pending = node;
    while (pending != NULL) {
        node = pending;
        pending = node->plus;
        pending_push(&pending, node->hash);
        for (uint32_t i = 0; i < node->children.capacity; i++) {
            pending_push(&pending, node->children.slots[i].node);
        }
        PyMem_Free(node->children.slots);
        Py_CLEAR(node->terminal);
        PyMem_Free(node);
    }
}

static void
table_free_tree(Table *table)
{
    for (uint32_t i = 0; i < table->capacity; i++) {
        if (table->slots[i].node != NULL) {
            node_free_tree(table->slots[i].node);
        }
    }
    PyMem_Free(table->slots);
    table->slots = NULL;
    table->capacity = table->count = 0;
}

static Node *
table_get(const Table *table, const char *key, Py_ssize_t length, Py_hash_t hash)
{
    if (table->count == 0) {
        return NULL;
    }
    uint32_t mask = table->capacity - 1;
    for (uint32_t i = (uint32_t)hash & mask;; i = (i + 1) & mask) {
        const Slot *slot = &table->slots[i];
        if (slot->node == NULL) {
            return NULL;
        }
        if (slot->hash == hash && slot->node->length == length
            && memcmp(slot->node->key, key, (size_t)length) == 0) {
            return slot->node;
        }
    }
}

static void
table_place(Slot *slots, uint32_t capacity, Py_hash_t hash, Node *node)
{
    uint32_t mask = capacity - 1;
    uint32_t i = (uint32_t)hash & mask;
    while (slots[i].node != NULL) {
        i = (i + 1) & mask;
    }
    slots[i].hash = hash;
    slots[i].node = node;
}

static int
table_resize(Table *table, uint32_t capacity)
{
    Slot *slots = PyMem_Calloc(capacity, sizeof(Slot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint32_t i = 0; i < table->capacity; i++) {
        if (table->slots[i].node != NULL) {
            table_place(slots, capacity, table->slots[i].hash, table->slots[i].node);
        }
    }
    PyMem_Free(table->slots);
    table->slots = slots;
    table->capacity = capacity;
    return 0;
}

/* Add a node known to be absent. */
static int
table_add(Table *table, Py_hash_t hash, Node *node)
{
    if ((table->count + 1) * 3 >= table->capacity * 2) {
        uint32_t capacity = table->capacity ? table->capacity * 2 : MIN_CAPACITY;
        while ((table->count + 1) * 3 >= capacity * 2) {
            capacity *= 2;
        }
        if (table_resize(table, capacity) < 0) {
            return -1;
        }
    }
    table_place(table->slots, table->capacity, hash, node);
    table->count++;
    return 0;
}

/* Remove the slot holding node (it must be there); shrink a table that became sparse. */
static void
table_remove(Table *table, Py_hash_t hash, const Node *node)
{
    uint32_t mask = table->capacity - 1;
    uint32_t hole = (uint32_t)hash & mask;
    while (table->slots[hole].node != node) {
        hole = (hole + 1) & mask;
    }
    /* Backward-shift deletion: move later entries of the run into the hole when their
     * home slot does not lie (cyclically) between the hole and their position. */
    for (uint32_t i = (hole + 1) & mask; table->slots[i].node != NULL; i = (i + 1) & mask) {
        uint32_t home = (uint32_t)table->slots[i].hash & mask;
        int between = hole <= i ? (hole < home && home <= i) : (hole < home || home <= i);
        if (!between) {
            table->slots[hole] = table->slots[i];
            hole = i;
        }
    }
    table->slots[hole].node = NULL;
    table->count--;
    if (table->count == 0) {
        PyMem_Free(table->slots);
        table->slots = NULL;
        table->capacity = 0;
    }
    else if (table->capacity > 8 && table->count * 8 < table->capacity) {
        /* A failed shrink keeps the larger table: still correct. */
        if (table_resize(table, table->capacity / 2) < 0) {
            PyErr_Clear();
        }
    }
}

/* -- reading str arguments ------------------------------------------------------------ */

/* The UTF-8 bytes of a str (no copy for ASCII); NULL with an exception set otherwise. */
static const char *
utf8_of(PyObject *text, Py_ssize_t *length)
{
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "expected a str, not %.100s", Py_TYPE(text)->tp_name);
        return NULL;
    }
    if (PyUnicode_IS_COMPACT_ASCII(text)) {
        *length = PyUnicode_GET_LENGTH(text);
        return (const char *)PyUnicode_DATA(text);
    }
    return PyUnicode_AsUTF8AndSize(text, length);
}

static int
has_wildcard(const char *data, Py_ssize_t length)
{
    return memchr(data, '+', (size_t)length) != NULL || memchr(data, '#', (size_t)length) != NULL;
}

/* Check what the index relies on: a non-empty filter whose '#' is a whole last level and
 * whose '+' are whole levels. (router.core.topics checks every MQTT rule before this.) */
static int
check_filter(const char *data, Py_ssize_t length)
{
    if (length == 0) {
        PyErr_SetString(PyExc_ValueError, "a topic filter must not be empty");
        return -1;
    }
    for (Py_ssize_t i = 0; i < length; i++) {
        char c = data[i];
        if (c != '+' && c != '#') {
            continue;
        }
        int starts = i == 0 || data[i - 1] == '/';
        int ends = i + 1 == length || data[i + 1] == '/';
        if (!starts || !ends || (c == '#' && i + 1 != length)) {
            PyErr_SetString(PyExc_ValueError, "a wildcard must be a whole level, '#' the last");
            return -1;
        }
    }
    return 0;
}

/* -- the index ------------------------------------------------------------------------ */

/* The node where a wildcard filter ends, created on demand (or NULL: absent / error). */
static Node *
trie_terminal(FilterIndex *self, const char *data, Py_ssize_t length, int create)
{
    Node *node = self->root;
    Py_ssize_t start = 0;
    for (;;) {
        const char *end = memchr(data + start, '/', (size_t)(length - start));
        Py_ssize_t level_length = (end ? end - data : length) - start;
        const char *level = data + start;
        Node **slot = NULL;
        Node *child;
        if (level_length == 1 && level[0] == '+') {
            slot = &node->plus;
            child = node->plus;
        }
        else if (level_length == 1 && level[0] == '#') {
            slot = &node->hash;
            child = node->hash;
        }
        else {
            Py_hash_t hash = hash_bytes(level, level_length);
            child = table_get(&node->children, level, level_length, hash);
            if (child == NULL && create) {
                child = node_new(level, level_length);
                if (child == NULL) {
                    return NULL;
                }
                if (table_add(&node->children, hash, child) < 0) {
                    PyMem_Free(child);
                    return NULL;
                }
                self->nodes++;
            }
        }
        if (slot != NULL && child == NULL && create) {
            child = *slot = node_new(level, level_length);
            if (child == NULL) {
                return NULL;
            }
            self->nodes++;
        }
        if (child == NULL) {
            return NULL;
        }
        node = child;
        if (end == NULL) {
            return node;
        }
        start = end - data + 1;
    }
}

/* Remove the emptied nodes on the path of a wildcard filter, deepest first (the path
 * as far as it exists: after a failed add, its end was never made). Linear in the
 * filter's levels. Without memory for a deep path, empty nodes stay: answers are still
 * right, node_count() counts them. */
static void
trie_trim(FilterIndex *self, const char *data, Py_ssize_t length)
{
    Py_ssize_t levels = 1;
    for (Py_ssize_t i = 0; i < length; i++) {
        levels += data[i] == '/';
    }
    Node *inline_path[STACK_LEVELS];
    Node **path = inline_path;
    if (levels > STACK_LEVELS && (path = PyMem_Malloc((size_t)levels * sizeof(Node *))) == NULL) {
        return;
    }
    Node *node = self->root;
    Py_ssize_t depth = 0;
    for (Py_ssize_t start = 0; depth < levels; start += 1) {
        const char *end = memchr(data + start, '/', (size_t)(length - start));
        const char *level = data + start;
        Py_ssize_t level_length = (end ? end - data : length) - start;
        if (level_length == 1 && level[0] == '+') {
            node = node->plus;
        }
        else if (level_length == 1 && level[0] == '#') {
            node = node->hash;
        }
        else {
            node = table_get(&node->children, level, level_length, hash_bytes(level, level_length));
        }
        if (node == NULL) {
            break;
        }
        path[depth++] = node;
        start += level_length;  /* then past the '/' (the loop's step) */
    }
    while (depth-- > 0) {
        node = path[depth];
        if (!node_is_empty(node)) {
            break;
        }
        Node *parent = depth ? path[depth - 1] : self->root;
        if (node == parent->plus) {
            parent->plus = NULL;
        }
        else if (node == parent->hash) {
            parent->hash = NULL;
        }
        else {
            table_remove(&parent->children, hash_bytes(node->key, node->length), node);
        }
        PyMem_Free(node);
        self->nodes--;
    }
    if (path != inline_path) {
        PyMem_Free(path);
    }
}

static PyObject *
FilterIndex_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "FilterIndex() takes no arguments");
        return NULL;
    }
    FilterIndex *self = (FilterIndex *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->root = node_new(NULL, 0);
    if (self->root == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void
FilterIndex_dealloc(FilterIndex *self)
{
    if (self->root != NULL) {
        node_free_tree(self->root);
    }
    table_free_tree(&self->exact);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t
FilterIndex_len(FilterIndex *self)
{
    return self->size;
}

/* The node of a filter (exact or trie), or NULL (no exception) when absent. */
static Node *
find(FilterIndex *self, const char *data, Py_ssize_t length, Py_hash_t *exact_hash)
{
    if (!has_wildcard(data, length)) {
        *exact_hash = hash_bytes(data, length);
        return table_get(&self->exact, data, length, *exact_hash);
    }
    return trie_terminal(self, data, length, 0);
}

static PyObject *
FilterIndex_get(FilterIndex *self, PyObject *topic_filter)
{
    Py_ssize_t length;
    const char *data = utf8_of(topic_filter, &length);
    if (data == NULL) {
        return NULL;
    }
    Py_hash_t hash;
    Node *node = find(self, data, length, &hash);
    PyObject *terminal = node != NULL && node->terminal != NULL ? node->terminal : Py_None;
    return Py_NewRef(terminal);
}

static PyObject *
FilterIndex_add(FilterIndex *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "add() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t length;
    const char *data = utf8_of(args[0], &length);
    if (data == NULL || check_filter(data, length) < 0) {
        return NULL;
    }
    Node *node;
    if (!has_wildcard(data, length)) {
        Py_hash_t hash = hash_bytes(data, length);
        node = table_get(&self->exact, data, length, hash);
        if (node == NULL) {
            node = node_new(data, length);
            if (node == NULL) {
                return NULL;
            }
            if (table_add(&self->exact, hash, node) < 0) {
                PyMem_Free(node);
                return NULL;
            }
        }
    }
    else {
        node = trie_terminal(self, data, length, 1);
        if (node == NULL) {
            /* Nodes created before the failure are empty: trim them again. */
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            trie_trim(self, data, length);
            PyErr_Restore(type, value, traceback);
            return NULL;
        }
    }
    if (node->terminal == NULL) {
        self->size++;
    }
    Py_XSETREF(node->terminal, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

static PyObject *
FilterIndex_remove(FilterIndex *self, PyObject *topic_filter)
{
    Py_ssize_t length;
    const char *data = utf8_of(topic_filter, &length);
    if (data == NULL) {
        return NULL;
    }
    Py_hash_t hash = 0;
    Node *node = find(self, data, length, &hash);
    if (node == NULL || node->terminal == NULL) {
        PyErr_SetObject(PyExc_KeyError, topic_filter);
        return NULL;
    }
    PyObject *terminal = node->terminal;  /* the reference passes to the caller */
    node->terminal = NULL;
    self->size--;
    if (!has_wildcard(data, length)) {
        table_remove(&self->exact, hash, node);
        PyMem_Free(node);
    }
    else {
        trie_trim(self, data, length);
    }
    return terminal;
}

typedef struct {
    const Node *node;
    Py_ssize_t level;  /* the topic level this node is matched against */
} Step;

static int
append_terminal(PyObject *found, const Node *node)
{
    return node->terminal == NULL ? 0 : PyList_Append(found, node->terminal);
}

/* Append the terminals of the wildcard filters matching the topic's levels. */
static int
walk(const Node *root, const char *const *starts, const Py_ssize_t *lengths,
     const Py_hash_t *hashes, Py_ssize_t levels, int dollar, PyObject *found)
{
    Step inline_stack[2 * STACK_LEVELS + 2];
    Step *stack = inline_stack;
    Py_ssize_t capacity = 2 * STACK_LEVELS + 2;
    Py_ssize_t depth = 0;
    int status = 0;
    stack[depth++] = (Step){root, 0};
    while (depth > 0) {
        Step step = stack[--depth];
        const Node *node = step.node;
        Py_ssize_t at = step.level;
        /* First-level wildcards never match a topic that starts with '$'. */
        int wild = !(dollar && node == root);
        if (wild && node->hash != NULL && append_terminal(found, node->hash) < 0) {
            status = -1;
            break;
        }
        if (at == levels) {
            if (append_terminal(found, node) < 0) {
                status = -1;
                break;
            }
            continue;
        }
        /* Each step pushes at most two; the stack holds at most one per level plus one. */
        if (depth + 2 > capacity) {
            Py_ssize_t bigger = capacity * 2;
            Step *grown = PyMem_Malloc((size_t)bigger * sizeof(Step));
            if (grown == NULL) {
                PyErr_NoMemory();
                status = -1;
                break;
            }
            memcpy(grown, stack, (size_t)depth * sizeof(Step));
            if (stack != inline_stack) {
                PyMem_Free(stack);
            }
            stack = grown;
            capacity = bigger;
        }
        if (wild && node->plus != NULL) {
            stack[depth++] = (Step){node->plus, at + 1};
        }
        const Node *child = table_get(&node->children, starts[at], lengths[at], hashes[at]);
        if (child != NULL) {
            stack[depth++] = (Step){child, at + 1};
        }
    }
    if (stack != inline_stack) {
        PyMem_Free(stack);
    }
    return status;
}

/* Is this a valid MQTT topic name (1..65535 bytes, no wildcard, no U+0000)? */
static int
valid_topic(const char *data, Py_ssize_t length)
{
    if (length == 0 || length > 65535) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < length; i++) {
        char c = data[i];
        if (c == '+' || c == '#' || c == '\0') {
            return 0;
        }
    }
    return 1;
}

/* The UTF-8 bytes of a valid topic name; NULL (no exception) when it is not one. */
static const char *
topic_bytes(PyObject *topic, Py_ssize_t *length)
{
    const char *data;
    if (PyUnicode_CheckExact(topic) && PyUnicode_IS_COMPACT_ASCII(topic)) {
        *length = PyUnicode_GET_LENGTH(topic);
        data = (const char *)PyUnicode_DATA(topic);
    }
    else if (!PyUnicode_Check(topic)) {
        return NULL;
    }
    else if ((data = PyUnicode_AsUTF8AndSize(topic, length)) == NULL) {
        PyErr_Clear();  /* a lone surrogate: not a valid topic name */
        return NULL;
    }
    return valid_topic(data, *length) ? data : NULL;
}

/* Fill found with the terminals matching the valid topic name data. */
static int
fill_terminals(FilterIndex *self, const char *data, Py_ssize_t length, PyObject *found)
{
    if (self->exact.count) {
        const Node *node = table_get(&self->exact, data, length, hash_bytes(data, length));
        if (node != NULL && append_terminal(found, node) < 0) {
            return -1;
        }
    }
    if (self->nodes == 0) {
        return 0;
    }
    int status = -1;
    Py_ssize_t levels = 1;
    for (Py_ssize_t i = 0; i < length; i++) {
        levels += data[i] == '/';
    }
    const char *inline_starts[STACK_LEVELS];
    Py_ssize_t inline_lengths[STACK_LEVELS];
    Py_hash_t inline_hashes[STACK_LEVELS];
    const char **starts = inline_starts;
    Py_ssize_t *lengths = inline_lengths;
    Py_hash_t *hashes = inline_hashes;
    if (levels > STACK_LEVELS) {
        starts = PyMem_Malloc((size_t)levels * sizeof(*starts));
        lengths = PyMem_Malloc((size_t)levels * sizeof(*lengths));
        hashes = PyMem_Malloc((size_t)levels * sizeof(*hashes));
        if (starts == NULL || lengths == NULL || hashes == NULL) {
            PyErr_NoMemory();
            goto cleanup;
        }
    }
    Py_ssize_t start = 0;
    for (Py_ssize_t at = 0; at < levels; at++) {
        const char *end = memchr(data + start, '/', (size_t)(length - start));
        Py_ssize_t stop = end ? end - data : length;
        starts[at] = data + start;
        lengths[at] = stop - start;
        hashes[at] = hash_bytes(starts[at], lengths[at]);
        start = stop + 1;
    }
    status = walk(self->root, starts, lengths, hashes, levels, data[0] == '$', found);
cleanup:
    if (starts != inline_starts) {
        PyMem_Free(starts);
        PyMem_Free(lengths);
        PyMem_Free(hashes);
    }
    return status;
}

static PyObject *
FilterIndex_terminals(FilterIndex *self, PyObject *topic)
{
    Py_ssize_t length;
    const char *data = topic_bytes(topic, &length);
    if (data == NULL) {
        Py_RETURN_NONE;
    }
    PyObject *found = PyList_New(0);
    if (found == NULL) {
        return NULL;
    }
    if (fill_terminals(self, data, length, found) < 0) {
        Py_DECREF(found);
        return NULL;
    }
    return found;
}

static PyObject *subs_name, *groups_name, *update_name;  /* interned */

/* The subs of a terminal (a new reference: a dict, or None), or NULL with an exception;
 * *grouped is set when the terminal's groups is not None. */
static PyObject *
subscribers_of(PyObject *terminal, int *grouped)
{
    if (Py_IS_TYPE(terminal, &TerminalType)) {
        Terminal *known = (Terminal *)terminal;
        *grouped = known->groups != NULL && known->groups != Py_None;
        PyObject *subs = known->subs != NULL ? known->subs : Py_None;
        if (subs != Py_None && !PyDict_Check(subs)) {
            PyErr_SetString(PyExc_TypeError, "a terminal's subs must be a dict or None");
            return NULL;
        }
        return Py_NewRef(subs);
    }
    PyObject *groups = PyObject_GetAttr(terminal, groups_name);
    if (groups == NULL) {
        return NULL;
    }
    *grouped = groups != Py_None;
    Py_DECREF(groups);
    PyObject *subs = PyObject_GetAttr(terminal, subs_name);
    if (subs != NULL && subs != Py_None && !PyDict_Check(subs)) {
        PyErr_SetString(PyExc_TypeError, "a terminal's subs must be a dict or None");
        Py_CLEAR(subs);
    }
    return subs;
}

/* Add the keys of the dict subs to the set union_: one by one for a few (cheaper than a
 * method call), else by set.update (which sizes the table once and reuses the dict's
 * stored hashes). */
static int
add_keys(PyObject *union_, PyObject *subs)
{
    if (PyDict_GET_SIZE(subs) > 8) {
        PyObject *args[2] = {union_, subs};
        PyObject *none = PyObject_VectorcallMethod(update_name, args, 2, NULL);
        Py_XDECREF(none);
        return none == NULL ? -1 : 0;
    }
    Py_ssize_t position = 0;
    PyObject *key, *value;
    while (PyDict_Next(subs, &position, &key, &value)) {
        if (PySet_Add(union_, key) < 0) {
            return -1;
        }
    }
    return 0;
}

static PyObject *
FilterIndex_clients(FilterIndex *self, PyObject *topic)
{
    PyObject *found = FilterIndex_terminals(self, topic);
    if (found == NULL || found == Py_None) {
        return found;
    }
    PyObject *first = NULL;   /* the first subs dict met */
    PyObject *union_ = NULL;  /* a set, once a second subs dict is met */
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(found); i++) {
        int grouped = 0;
        PyObject *subs = subscribers_of(PyList_GET_ITEM(found, i), &grouped);
        if (subs == NULL || grouped) {
            if (subs != NULL) {
                Py_DECREF(subs);
                result = Py_NewRef(Py_None);
            }
            goto done;
        }
        if (subs == Py_None) {
            Py_DECREF(subs);
            continue;
        }
        if (first == NULL) {
            first = subs;
            continue;
        }
        if (union_ == NULL && (union_ = PySet_New(first)) == NULL) {
            Py_DECREF(subs);
            goto done;
        }
        if (add_keys(union_, subs) < 0) {
            Py_DECREF(subs);
            goto done;
        }
        Py_DECREF(subs);
    }
    result = union_ != NULL ? Py_NewRef(union_) : PySet_New(first);
done:
    Py_XDECREF(union_);
    Py_XDECREF(first);
    Py_DECREF(found);
    return result;
}

/* -- reading everything --------------------------------------------------------------- */

/* A node to visit, and the length of the path above it. */
typedef struct {
    const Node *node;
    Py_ssize_t base;
} ItemFrame;

typedef struct {
    ItemFrame *frames;
    size_t size;
    size_t capacity;
} ItemStack;

static int
item_stack_push(ItemStack *stack, const Node *node, Py_ssize_t base)
{
    if (stack->size == stack->capacity) {
        size_t grown = stack->capacity ? stack->capacity * 2 : 64;
        ItemFrame *frames = PyMem_Realloc(stack->frames, grown * sizeof(ItemFrame));
        if (frames == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        stack->frames = frames;
        stack->capacity = grown;
    }
    stack->frames[stack->size].node = node;
    stack->frames[stack->size].base = base;
    stack->size++;
    return 0;
}

/* Push what is below node so that it is visited in the order '+', '#', then the literal
 * children in slot order (the stack gives the last pushed first). */
static int
item_stack_push_below(ItemStack *stack, const Node *node, Py_ssize_t base)
{
    for (uint32_t i = node->children.capacity; i-- > 0;) {
        const Node *child = node->children.slots[i].node;
        if (child != NULL && item_stack_push(stack, child, base) < 0) {
            return -1;
        }
    }
    if (node->hash != NULL && item_stack_push(stack, node->hash, base) < 0) {
        return -1;
    }
    if (node->plus != NULL && item_stack_push(stack, node->plus, base) < 0) {
        return -1;
    }
    return 0;
}

/* Append (filter, terminal) for every terminal below root, depth first with an explicit
 * stack (no recursion, whatever the depth). path: a bytearray, the filter being built,
 * each level followed by '/'. */
static int
collect_items(const Node *root, PyObject *path, PyObject *items)
{
    ItemStack stack = {NULL, 0, 0};
    int status = item_stack_push_below(&stack, root, 0);
    while (status == 0 && stack.size > 0) {
        ItemFrame frame = stack.frames[--stack.size];
        const Node *node = frame.node;
        Py_ssize_t end = frame.base + node->length;
        if (PyByteArray_Resize(path, end + 1) < 0) {
            status = -1;
            break;
        }
        char *buffer = PyByteArray_AS_STRING(path);
        memcpy(buffer + frame.base, node->key, (size_t)node->length);
        buffer[end] = '/';
        if (node->terminal != NULL) {
            PyObject *text = PyUnicode_DecodeUTF8(buffer, end, "strict");
            PyObject *item = text == NULL ? NULL : PyTuple_Pack(2, text, node->terminal);
            Py_XDECREF(text);
            if (item == NULL || PyList_Append(items, item) < 0) {
                Py_XDECREF(item);
                status = -1;
                break;
            }
            Py_DECREF(item);
        }
        status = item_stack_push_below(&stack, node, end + 1);
    }
    PyMem_Free(stack.frames);
    return status;
}

static PyObject *
FilterIndex_items(FilterIndex *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *items = PyList_New(0);
    if (items == NULL) {
        return NULL;
    }
    for (uint32_t i = 0; i < self->exact.capacity; i++) {
        const Node *node = self->exact.slots[i].node;
        if (node == NULL) {
            continue;
        }
        PyObject *item = Py_BuildValue("(s#O)", node->key, node->length, node->terminal);
        if (item == NULL || PyList_Append(items, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(items);
            return NULL;
        }
        Py_DECREF(item);
    }
    PyObject *path = PyByteArray_FromStringAndSize(NULL, 0);
    if (path == NULL) {
        Py_DECREF(items);
        return NULL;
    }
    int status = collect_items(self->root, path, items);
    Py_DECREF(path);
    if (status < 0) {
        Py_DECREF(items);
        return NULL;
    }
    return items;
}

static PyObject *
FilterIndex_node_count(FilterIndex *self, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromSsize_t(self->nodes + (Py_ssize_t)self->exact.count);
}

static PyMethodDef FilterIndex_methods[] = {
    {"get", (PyCFunction)FilterIndex_get, METH_O,
     "get(filter) -> the terminal of a plain filter, or None."},
    {"add", (PyCFunction)(void (*)(void))FilterIndex_add, METH_FASTCALL,
     "add(filter, terminal): map a plain filter to its terminal (replacing one)."},
    {"remove", (PyCFunction)FilterIndex_remove, METH_O,
     "remove(filter) -> its terminal; KeyError if absent. Emptied nodes are freed."},
    {"terminals", (PyCFunction)FilterIndex_terminals, METH_O,
     "terminals(topic) -> the terminals of every filter matching the topic name, or None "
     "when it is not a valid topic name."},
    {"clients", (PyCFunction)FilterIndex_clients, METH_O,
     "clients(topic) -> a new set of the keys of the matching terminals' subs, or None "
     "when the topic is not a valid topic name or a matching terminal has groups."},
    {"items", (PyCFunction)FilterIndex_items, METH_NOARGS,
     "items() -> [(filter, terminal)] for every filter, in no particular order."},
    {"node_count", (PyCFunction)FilterIndex_node_count, METH_NOARGS,
     "node_count() -> trie nodes plus exact entries held (0 when empty)."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods FilterIndex_as_sequence = {
    .sq_length = (lenfunc)FilterIndex_len,
};

static PyTypeObject FilterIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "router.core._filter_index.FilterIndex",
    .tp_doc = "Plain topic filters -> terminal objects, matched against topic names in C.",
    .tp_basicsize = sizeof(FilterIndex),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = FilterIndex_new,
    .tp_dealloc = (destructor)FilterIndex_dealloc,
    .tp_methods = FilterIndex_methods,
    .tp_as_sequence = &FilterIndex_as_sequence,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "router.core._filter_index",
    .m_doc = "The compiled filter index (see router.core.filter_index).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__filter_index(void)
{
    if (PyType_Ready(&FilterIndexType) < 0 || PyType_Ready(&TerminalType) < 0) {
        return NULL;
    }
    subs_name = PyUnicode_InternFromString("subs");
    groups_name = PyUnicode_InternFromString("groups");
    update_name = PyUnicode_InternFromString("update");
    if (subs_name == NULL || groups_name == NULL || update_name == NULL) {
        return NULL;
    }
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(mod, "FilterIndex", (PyObject *)&FilterIndexType) < 0
        || PyModule_AddObjectRef(mod, "Terminal", (PyObject *)&TerminalType) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
