/* plan_type.c: fuser._C.Plan, a plan as the core holds it (a fuser_plan derived and costed on a target), the
 * object _C.search and _C.derive return and _C.derive, _C.codegen, _C.simulate and _C.load_kernel take without
 * reading a dict; fuser.Plan wraps one. Immutable. Taken by a function with a target, it is derived again from
 * its chain and searched fields on that target, as a dict would be (the caller chooses what a plan is checked
 * against), so the two forms cannot differ; a dict is still read where one is given (a plan from JSON). */
#include "binding.h"

#include <stddef.h>
#include <string.h>

#include "fuser/plan.h"

typedef struct {
    PyObject_HEAD
    fuser_plan plan;
    fuser_target target; /* the target it was derived and costed on */
} plan_object;

/* (binding.h) */
PyObject *fuser_plan_object_new(fuser_state *st, const fuser_plan *p, const fuser_target *t)
{
    plan_object *o = PyObject_New(plan_object, (PyTypeObject *)st->plan_type);
    if (!o)
        return NULL;
    o->plan = *p;
    o->target = *t;
    return (PyObject *)o;
}

/* (binding.h) */
int fuser_plan_from_obj(fuser_state *st, PyObject *obj, const fuser_target *t, fuser_plan *p)
{
    if (!PyObject_TypeCheck(obj, (PyTypeObject *)st->plan_type))
        return fuser_plan_from_dict(obj, t, p);
    const fuser_plan *src = &((plan_object *)obj)->plan;
    fuser_plan_unfused(&src->chain, p);
    if ((p->fused = src->fused)) {
        p->kind = src->kind;
        p->cls_m = src->cls_m, p->cls_n = src->cls_n, p->cls_k = src->cls_k, p->cls_l = src->cls_l;
        p->bm = src->bm, p->bn = src->bn, p->bl = src->bl, p->n_iters = src->n_iters, p->stages = src->stages;
        p->order = src->order, p->gate_mode = src->gate_mode;
        p->s1 = src->s1, p->s2 = src->s2, p->phases = src->phases, p->lspan = src->lspan;
    }
    return fuser_plan_finish(p, t);
}

static PyObject *plan_to_dict_method(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    return fuser_plan_to_dict(&((plan_object *)self)->plan);
}

/* (derive, (its dict, its target's dict)): pickling and copying rebuild it through _C.derive */
static PyObject *plan_reduce(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    PyObject *mod = PyType_GetModule(Py_TYPE(self));
    PyObject *derive = mod ? PyObject_GetAttrString(mod, "derive") : NULL;
    PyObject *d = derive ? fuser_plan_to_dict(&((plan_object *)self)->plan) : NULL;
    PyObject *t = d ? fuser_target_to_dict(&((plan_object *)self)->target) : NULL;
    PyObject *res = t ? Py_BuildValue("(O(OO))", derive, d, t) : NULL;
    Py_XDECREF(derive);
    Py_XDECREF(d);
    Py_XDECREF(t);
    return res;
}

static PyObject *plan_repr(PyObject *self)
{
    const fuser_plan *p = &((plan_object *)self)->plan;
    char df[160];
    fuser_plan_dataflow_str(p, df, sizeof df);
    return PyUnicode_FromFormat("<fuser._C.Plan %s, m=%lld, %s>", p->fused ? "fused" : "unfused",
                                (long long)p->chain.m, df);
}

static PyObject *plan_fused(PyObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(((plan_object *)self)->plan.fused);
}

static PyObject *plan_predicted_us(PyObject *self, void *closure)
{
    (void)closure;
    return PyFloat_FromDouble(((plan_object *)self)->plan.cost.total);
}

static void plan_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyMethodDef plan_methods[] = {
    {"to_dict", plan_to_dict_method, METH_NOARGS,
     "to_dict() -> dict: the plan's fields (chain, fused, dataflow, traffic, cost; a fused plan's params,\n"
     "derived fields and dataflows), a new dict each call."},
    {"__reduce__", plan_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef plan_getset[] = {
    {"fused", plan_fused, NULL, "whether the plan runs a fused kernel", NULL},
    {"predicted_us", plan_predicted_us, NULL, "the cost model's time for it on its target, microseconds", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot plan_slots[] = {
    {Py_tp_doc, "A plan as fuser's core holds it, derived and costed on a target: what _C.search and _C.derive\n"
                "return, and what _C.derive, _C.codegen, _C.simulate and _C.load_kernel take (as they take a\n"
                "plan dict). Made by those functions only; immutable. fuser.Plan wraps one."},
    {Py_tp_dealloc, plan_dealloc},
    {Py_tp_repr, plan_repr},
    {Py_tp_methods, plan_methods},
    {Py_tp_getset, plan_getset},
    {0, NULL},
};

static PyType_Spec plan_spec = {
    .name = "fuser._C.Plan",
    .basicsize = sizeof(plan_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = plan_slots,
};

/* (binding.h) */
int fuser_plan_type_add(PyObject *module, fuser_state *st)
{
    st->plan_type = PyType_FromModuleAndSpec(module, &plan_spec, NULL);
    return st->plan_type ? PyModule_AddObjectRef(module, "Plan", st->plan_type) : -1;
}
