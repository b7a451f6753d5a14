package rmqremoting

var FastJSON = fastJSON
