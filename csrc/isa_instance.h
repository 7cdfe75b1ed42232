/* isa_instance.h: one instance of foreach_isa.h's loop: TD_ISA_FILE compiled under the
   instruction set's macros, which are then undefined for the next one. */
#include TD_ISA_FILE
#undef VEC
#undef VL
#undef REGS
#undef PLAIN
#undef NEON
#undef TARGET
#undef ISA
