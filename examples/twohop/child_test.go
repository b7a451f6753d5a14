package twohop_test

const childEnv = "IDEM_TWOHOP_RELAY_CHILD"

func runChild() int { return 2 }
